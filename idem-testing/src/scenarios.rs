//! One run of the harness: the probe of the test-fault protocol, the scenarios, and the
//! proofs 1 to 3 they check.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::harness::{Counter, Harness, HarnessError};
use crate::lookup::{self, Looked};
use crate::probe::{FaultProbe, fault_ignored};
use crate::proxy::Proxy;
use crate::report::{Report, Scenario, ScenarioReport, Verdict};
use crate::seen::{Evidence, Seen};
use crate::send::{Sender, problem_type};
use idem_runtime::TestFault;

/// One run of the harness.
pub(super) struct Run<'h> {
    pub(super) harness: &'h Harness,
    pub(super) base: reqwest::Url,
    pub(super) addr: SocketAddr,
    pub(super) sender: Sender,
    pub(super) effects: Counter,
}

/// What a scenario showed.
enum Outcome {
    /// The answers, and the verdicts on proofs 1 to 3.
    Checked(Vec<Seen>, [Verdict; 3]),
    /// The service did not apply the scenario's fault: why nothing can be checked.
    FaultIgnored(String),
}

impl Run<'_> {
    pub(super) async fn count(&self) -> Result<u64, HarnessError> {
        (self.effects)().await.map_err(HarnessError::EffectCounter)
    }

    async fn send(&self, base: &reqwest::Url, key: &str, fault: Option<TestFault>) -> Seen {
        self.sender.send(base, key, fault).await
    }

    /// The probe (when a scenario needs the test-fault protocol), then every scenario.
    pub(super) async fn all(&self) -> Result<Report, HarnessError> {
        let needs_faults = self
            .harness
            .scenarios
            .iter()
            .any(|s| s.test_fault().is_some());
        let fault_probe = match needs_faults {
            true => Some(self.probe().await?),
            false => None,
        };
        let mut scenarios = Vec::new();
        for scenario in &self.harness.scenarios {
            let report = match &fault_probe {
                Some(probe) if scenario.test_fault().is_some() && !probe.honoured() => {
                    ScenarioReport::not_checked(*scenario, String::new(), &probe.not_run(*scenario))
                }
                _ => self.scenario(*scenario).await?,
            };
            scenarios.push(report);
        }
        Ok(Report {
            scenarios,
            fault_probe,
        })
    }

    /// `Idem-Test-Fault: answer-400` under a fresh key, its effects counted.
    async fn probe(&self) -> Result<FaultProbe, HarnessError> {
        let key = format!("monday-probe-{}", uuid::Uuid::now_v7());
        let before = self.count().await?;
        let answer = self
            .send(&self.base, &key, Some(TestFault::Answer(400)))
            .await;
        let effects = self.count().await?.saturating_sub(before);
        Ok(FaultProbe {
            key,
            answer,
            effects,
        })
    }

    pub(super) async fn scenario(
        &self,
        scenario: Scenario,
    ) -> Result<ScenarioReport, HarnessError> {
        let key = new_key();
        let before = self.count().await?;
        let outcome = match scenario {
            Scenario::LostAnswer => self.lost_answer(&key, before).await?,
            Scenario::TooManyRequests => self.refused(&key, before, 429).await?,
            Scenario::Transient503 => self.refused(&key, before, 503).await?,
            Scenario::Permanent400 => self.refused(&key, before, 400).await?,
            Scenario::Concurrent => self.concurrent(&key, before).await?,
            Scenario::Crash => self.crash(&key, before).await?,
        };
        let (answers, [one, linked, result]) = match outcome {
            Outcome::Checked(answers, verdicts) => (answers, verdicts),
            Outcome::FaultIgnored(why) => {
                let why = Verdict::NotChecked(why);
                return Ok(ScenarioReport::not_checked(scenario, key, &why));
            }
        };
        let effects = self.count().await?.saturating_sub(before);
        let path = self.harness.status_lookup.as_deref();
        let looked = lookup::look(&self.sender, &self.base, path, &key).await;
        let linked = lookup::with_lookup(scenario, linked, &answers, &looked, effects);
        let evidence = Evidence {
            scenario,
            key: key.clone(),
            client: self.harness.client.first().map(|(_, value)| value.clone()),
            answers,
            effects,
            lookup: looked.found().cloned(),
            sender: self.sender.clone(),
        };
        let trace = self.trace(&evidence).await;
        let operator = self.operator(&evidence, &looked).await;
        Ok(ScenarioReport {
            scenario,
            key,
            proofs: [one, linked, result, trace, operator],
        })
    }

    /// Proof 4: the plugged-in check, or not checked.
    async fn trace(&self, evidence: &Evidence) -> Verdict {
        match &self.harness.trace {
            Some(check) => check(evidence.clone()).await,
            None => Verdict::NotChecked(format!(
                "no trace check plugged in (Harness::check_trace); the answers show {} request(s) under {}",
                evidence.answers.len(),
                ids_summary(&evidence.operation_ids(), &self.harness.operation_id_header)
            )),
        }
    }

    /// Proof 5: the plugged-in check, or not checked.
    async fn operator(&self, evidence: &Evidence, looked: &Looked) -> Verdict {
        if let Some(check) = &self.harness.operator {
            return check(evidence.clone()).await;
        }
        Verdict::NotChecked(match looked.found() {
            Some(found) => format!(
                "no operator check plugged in (Harness::check_operator); {}",
                lookup::summary(found)
            ),
            None => "no operator check plugged in (Harness::check_operator), no status lookup read"
                .into(),
        })
    }

    /// Proof 2 over `answers`, by the run's correlation header.
    fn linked(&self, answers: &[&Seen]) -> Verdict {
        same_operation(answers, &self.harness.operation_id_header)
    }

    /// The answer is lost on the way back; the same request again.
    async fn lost_answer(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let proxy = Proxy::start(self.addr).await?;
        let via = reqwest::Url::parse(&format!("http://{}/", proxy.addr()))
            .map_err(|e| HarnessError::Client(e.to_string()))?;
        let first = self.send(&via, key, None).await;
        let lost = proxy.exchanges().into_iter().next();
        drop(proxy);
        let lost_seen = lost.map(|lost| self.lost_seen(&lost));
        let retry = self.send(&self.base, key, None).await;
        let effects = self.count().await?.saturating_sub(before);
        let one = exactly(effects, 1, "2 requests with one key, the first answer lost");
        let Some(lost) = lost_seen else {
            let why = format!(
                "the proxy got no answer from the service for the first request ({})",
                first.describe()
            );
            return Ok(Outcome::Checked(
                vec![first, retry],
                [one, Verdict::Fail(why.clone()), Verdict::Fail(why)],
            ));
        };
        let linked = self.linked(&[&lost, &retry]);
        let result = lost_result(&lost, &retry);
        Ok(Outcome::Checked(vec![lost, retry], [one, linked, result]))
    }

    /// The lost answer as the proxy read it; the cookies it set are kept, as if the
    /// client had them already (the scenario is about the operation's answer, not the
    /// session).
    fn lost_seen(&self, lost: &crate::proxy::Exchange) -> Seen {
        let header = |name: &str| {
            lost.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        for (name, value) in &lost.headers {
            if name.eq_ignore_ascii_case("set-cookie") {
                self.sender.jar.set(value);
            }
        }
        Seen {
            status: Some(lost.status),
            operation_id: header(&self.harness.operation_id_header),
            replayed: lost.replayed,
            retry_after: header("retry-after"),
            location: header("location"),
            body: lost.body.clone(),
            problem_type: problem_type(&lost.body),
            ..Seen::default()
        }
    }

    /// The operation refuses with `status` (the test fault); the same request again,
    /// without the fault.
    async fn refused(&self, key: &str, before: u64, status: u16) -> Result<Outcome, HarnessError> {
        let fault = TestFault::Answer(status);
        let first = self.send(&self.base, key, Some(fault)).await;
        let mid = self.count().await?.saturating_sub(before);
        if first.complete() && first.status != Some(status) {
            return Ok(Outcome::FaultIgnored(fault_ignored(
                fault.header_value(),
                &first,
                mid,
            )));
        }
        let wait = first
            .retry_after
            .as_deref()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(Duration::ZERO, |s| Duration::from_secs(s.min(1)));
        tokio::time::sleep(wait).await;
        let retry = self.send(&self.base, key, None).await;
        let after = self.count().await?.saturating_sub(before);
        let permanent = status == 400;
        let one = if mid != 0 {
            Verdict::Fail(format!(
                "{mid} effect(s) behind the request with Idem-Test-Fault: {} ({}), expected none",
                fault.header_value(),
                first.describe()
            ))
        } else if permanent {
            exactly(after, 0, "a permanent 400 and its retry with one key")
        } else {
            exactly(after, 1, &format!("a {status} and its retry with one key"))
        };
        let linked = self.linked(&[&first, &retry]);
        let result = refused_result(fault, &first, &retry);
        Ok(Outcome::Checked(vec![first, retry], [one, linked, result]))
    }

    /// Concurrent requests with one key, then one more once they have all answered: the
    /// effects of each counted apart.
    async fn concurrent(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let n = self.harness.concurrency;
        let all = futures_util::future::join_all((0..n).map(|_| self.send(&self.base, key, None)));
        let mut answers = all.await;
        let during = self.count().await?.saturating_sub(before);
        let last = self.settled(key).await;
        let after = self
            .count()
            .await?
            .saturating_sub(before)
            .saturating_sub(during);
        let one = concurrent_effects(n, during, after, &last);
        let result = concurrent_result(&answers, &last);
        answers.push(last);
        let refs: Vec<&Seen> = answers.iter().collect();
        let linked = self.linked(&refs);
        Ok(Outcome::Checked(answers, [one, linked, result]))
    }

    /// The same request until it is not answered with a state, within the recovery time.
    async fn settled(&self, key: &str) -> Seen {
        let until = Instant::now() + self.harness.recovery_within;
        loop {
            let seen = self.send(&self.base, key, None).await;
            if !seen.is_state() || Instant::now() >= until {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The attempt dies after its effect; the same request until recovery decides.
    async fn crash(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let started = Instant::now();
        let first = self
            .send(&self.base, key, Some(TestFault::CrashAfterEffect))
            .await;
        if first.complete() {
            let effects = self.count().await?.saturating_sub(before);
            return Ok(Outcome::FaultIgnored(fault_ignored(
                TestFault::CrashAfterEffect.header_value(),
                &first,
                effects,
            )));
        }
        let until = started + self.harness.recovery_within;
        let mut answers = vec![first];
        loop {
            let seen = self.send(&self.base, key, None).await;
            let done = (!seen.is_state() && seen.complete()) || seen.is_parked();
            answers.push(seen);
            if done || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let took = started.elapsed();
        let effects = self.count().await?.saturating_sub(before);
        let one = exactly(
            effects,
            1,
            "a crash after the effect and the retries with its key",
        );
        let refs: Vec<&Seen> = answers.iter().skip(1).collect();
        let linked = self.linked(&refs);
        let result = crash_result(&answers, took);
        Ok(Outcome::Checked(answers, [one, linked, result]))
    }
}

/// Proof 3 of the lost answer: the retry gets the lost result, or the state.
fn lost_result(lost: &Seen, retry: &Seen) -> Verdict {
    if retry.complete() && retry.status == lost.status && retry.body == lost.body {
        Verdict::Pass(format!(
            "the lost {} came back byte for byte{}",
            lost.status(),
            replayed(retry)
        ))
    } else if retry.is_state() {
        Verdict::Pass(format!("the state of the operation: {}", retry.describe()))
    } else {
        Verdict::Fail(format!(
            "the lost answer was {}, the retry got {}{}",
            lost.status(),
            retry.describe(),
            if retry.status == lost.status {
                " with another body: not the stored result"
            } else {
                ""
            }
        ))
    }
}

/// Proof 3 of a refusal: a transient one with `Retry-After` then the result, a permanent
/// one replayed.
fn refused_result(fault: TestFault, first: &Seen, retry: &Seen) -> Verdict {
    let status = match fault {
        TestFault::Answer(status) => status,
        TestFault::CrashAfterEffect => 0,
    };
    if first.status != Some(status) {
        Verdict::Fail(format!(
            "the fault `{}` was not answered {status}: got {}",
            fault.header_value(),
            first.describe()
        ))
    } else if status == 400 {
        if retry.complete() && retry.status == Some(400) && retry.body == first.body {
            Verdict::Pass(format!(
                "the 400 is final: replayed to the retry{}",
                replayed(retry)
            ))
        } else {
            Verdict::Fail(format!(
                "the permanent 400 was not replayed: the retry got {}",
                retry.describe()
            ))
        }
    } else if first.retry_after.is_none() {
        Verdict::Fail(format!("the {status} has no Retry-After"))
    } else if retry.success() {
        Verdict::Pass(format!(
            "{status} with Retry-After: {}, then {} on the retry",
            first.retry_after.as_deref().unwrap_or(""),
            retry.describe()
        ))
    } else {
        Verdict::Fail(format!(
            "the retry after the {status} got {}, not the result",
            retry.describe()
        ))
    }
}

/// Proof 1 of the concurrent requests: one effect for them (`during`), none for the
/// request after them (`after`); or, when none of them got a result, one by the time
/// the request after them did.
fn concurrent_effects(n: usize, during: u64, after: u64, last: &Seen) -> Verdict {
    let what = format!("{n} requests with one key at once");
    let then = match after {
        0 => "none for the request after them".to_owned(),
        more => format!("{more} for the request after them ({})", last.describe()),
    };
    match (during, after) {
        (1, 0) | (0, 1) => Verdict::Pass(format!("{during} effect(s) for {what}; {then}")),
        (1, more) => Verdict::Fail(format!(
            "1 effect(s) for {what}, then {more} more for the request after them ({}): expected none",
            last.describe()
        )),
        (0, 0) => Verdict::Fail(format!(
            "0 effect(s) for {what} and none for the request after them, expected 1"
        )),
        (0, more) => Verdict::Fail(format!(
            "0 effect(s) for {what}, {more} for the request after them: expected 1 in all"
        )),
        (many, _) => Verdict::Fail(format!("{many} effect(s) for {what}, expected 1; {then}")),
    }
}

/// Proof 3 of the concurrent requests: one result or a state for each, and the same
/// result for the request after them.
fn concurrent_result(answers: &[Seen], last: &Seen) -> Verdict {
    let (mut results, mut replayed, mut states, mut other) = (Vec::new(), 0, 0, Vec::new());
    for (i, a) in answers.iter().enumerate() {
        if a.success() {
            results.push(&a.body);
            replayed += usize::from(a.replayed);
        } else if a.is_state() {
            states += 1;
        } else {
            other.push(format!("request {}: {}", i + 1, a.describe()));
        }
    }
    let answered = results.len();
    results.sort();
    results.dedup();
    if !other.is_empty() {
        Verdict::Fail(format!(
            "neither the result nor a state: {}",
            other.join("; ")
        ))
    } else if results.len() > 1 {
        Verdict::Fail(format!("{} different results for one key", results.len()))
    } else if !last.success() {
        Verdict::Fail(format!(
            "after they all answered, the same request got {}",
            last.describe()
        ))
    } else if results.first().is_some_and(|r| **r != last.body) {
        Verdict::Fail("after they all answered, the same request got another result".into())
    } else {
        Verdict::Pass(format!(
            "one result in {answered} answer(s) ({replayed} replayed), {states} state answer(s) (409/202 with Retry-After), then {} for the request after them",
            last.describe()
        ))
    }
}

/// Proof 3 of the crash: recovery decided (a result), or parked the operation.
fn crash_result(answers: &[Seen], took: Duration) -> Verdict {
    let Some(last) = answers.last() else {
        return Verdict::Fail("no answer after the crash".into());
    };
    let states = answers.len().saturating_sub(2);
    let ms = took.as_millis();
    if last.success() {
        Verdict::Pass(format!(
            "recovery decided within {ms} ms: {} after {states} state answer(s)",
            last.describe()
        ))
    } else if last.is_parked() {
        Verdict::Pass(format!(
            "recovery could not decide within {ms} ms: the state of the operation, {} (parked for an operator), after {states} state answer(s)",
            last.describe()
        ))
    } else if last.is_state() {
        Verdict::Fail(format!(
            "no result within {ms} ms: still {} after {} retries (the key is blocked)",
            last.describe(),
            answers.len() - 1
        ))
    } else {
        Verdict::Fail(format!(
            "after the crash the retry got {}, not the result",
            last.describe()
        ))
    }
}

fn replayed(seen: &Seen) -> &'static str {
    if seen.replayed {
        " (Idempotent-Replayed: true)"
    } else {
        ""
    }
}

fn exactly(effects: u64, expected: u64, what: &str) -> Verdict {
    if effects == expected {
        Verdict::Pass(format!("{effects} effect(s) for {what}"))
    } else {
        Verdict::Fail(format!(
            "{effects} effect(s) for {what}, expected {expected}"
        ))
    }
}

/// Every complete answer carries one and the same operation id, in `header`.
fn same_operation(answers: &[&Seen], header: &str) -> Verdict {
    let complete: Vec<&&Seen> = answers.iter().filter(|a| a.complete()).collect();
    if complete.is_empty() {
        return Verdict::Fail("no complete answer to link".into());
    }
    if let Some(missing) = complete.iter().find(|a| a.operation_id.is_none()) {
        return Verdict::Fail(format!(
            "an answer ({}) has no {header} header: proof 2 links the answers by it (Harness::operation_id_header, or idem monday's --operation-id-header, names the service's own correlation header)",
            missing.describe()
        ));
    }
    let mut distinct: Vec<&str> = complete
        .iter()
        .filter_map(|a| a.operation_id.as_deref())
        .collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > 1 {
        return Verdict::Fail(format!(
            "{} answers under {} different {header}s: {}",
            complete.len(),
            distinct.len(),
            distinct.join(", ")
        ));
    }
    Verdict::Pass(format!(
        "{} answers under one {header} {}",
        complete.len(),
        distinct[0]
    ))
}

fn ids_summary(ids: &[String], header: &str) -> String {
    match ids {
        [] => format!("no {header}"),
        [one] => format!("{header} {one}"),
        many => format!("{} {header}s", many.len()),
    }
}

fn new_key() -> String {
    format!("monday-{}", uuid::Uuid::now_v7())
}
