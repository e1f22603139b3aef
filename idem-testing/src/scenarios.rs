//! One run of the harness: the scenarios, and the proofs 1 to 3 they check.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::harness::{Counter, Harness, HarnessError};
use crate::proxy::Proxy;
use crate::report::{Scenario, ScenarioReport, Verdict};
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

impl Run<'_> {
    pub(super) async fn count(&self) -> Result<u64, HarnessError> {
        (self.effects)().await.map_err(HarnessError::EffectCounter)
    }

    async fn send(&self, base: &reqwest::Url, key: &str, fault: Option<TestFault>) -> Seen {
        self.sender.send(base, key, fault).await
    }

    async fn lookup(&self, key: &str) -> Option<serde_json::Value> {
        let path = self.harness.status_lookup.as_ref()?;
        let path = path.replace("{key}", key);
        let url = self.base.join(&path).ok()?;
        let mut builder = self.sender.client.get(url);
        if let Some((name, value)) = &self.harness.client {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let response = builder.send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        serde_json::from_slice(&response.bytes().await.ok()?).ok()
    }

    pub(super) async fn scenario(
        &self,
        scenario: Scenario,
    ) -> Result<ScenarioReport, HarnessError> {
        let key = new_key();
        let before = self.count().await?;
        let (answers, [one, linked, result]) = match scenario {
            Scenario::LostAnswer => self.lost_answer(&key, before).await?,
            Scenario::TooManyRequests => self.refused(&key, before, 429).await?,
            Scenario::Transient503 => self.refused(&key, before, 503).await?,
            Scenario::Permanent400 => self.refused(&key, before, 400).await?,
            Scenario::Concurrent => self.concurrent(&key, before).await?,
            Scenario::Crash => self.crash(&key, before).await?,
        };
        let effects = self.count().await?.saturating_sub(before);
        let lookup = self.lookup(&key).await;
        let linked = with_lookup(scenario, linked, &answers, lookup.as_ref());
        let evidence = Evidence {
            scenario,
            key: key.clone(),
            client: self.harness.client.as_ref().map(|(_, value)| value.clone()),
            answers,
            effects,
            lookup,
            sender: self.sender.clone(),
        };
        let trace = match &self.harness.trace {
            Some(check) => check(evidence.clone()).await,
            None => Verdict::NotChecked(format!(
                "no trace check plugged in (Harness::check_trace); the answers show {} request(s) under {}",
                evidence.answers.len(),
                ids_summary(&evidence.operation_ids())
            )),
        };
        let operator = match &self.harness.operator {
            Some(check) => check(evidence.clone()).await,
            None => Verdict::NotChecked(match &evidence.lookup {
                Some(found) => format!(
                    "no operator check plugged in (Harness::check_operator); {}",
                    lookup_summary(found)
                ),
                None => {
                    "no operator check plugged in (Harness::check_operator), no status lookup read"
                        .into()
                }
            }),
        };
        Ok(ScenarioReport {
            scenario,
            key,
            proofs: [one, linked, result, trace, operator],
        })
    }

    /// The answer is lost on the way back; the same request again.
    async fn lost_answer(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let proxy = Proxy::start(self.addr).await?;
        let via = reqwest::Url::parse(&format!("http://{}/", proxy.addr()))
            .map_err(|e| HarnessError::Client(e.to_string()))?;
        let first = self.send(&via, key, None).await;
        let lost = proxy.exchanges().into_iter().next();
        drop(proxy);
        let retry = self.send(&self.base, key, None).await;
        let effects = self.count().await?.saturating_sub(before);
        let one = exactly(effects, 1, "2 requests with one key, the first answer lost");
        let Some(lost) = lost else {
            let why = format!(
                "the proxy got no answer from the service for the first request ({})",
                first.describe()
            );
            return Ok((
                vec![first, retry],
                [one, Verdict::Fail(why.clone()), Verdict::Fail(why)],
            ));
        };
        let lost_seen = Seen {
            status: Some(lost.status),
            operation_id: lost.operation_id.clone(),
            replayed: lost.replayed,
            body: lost.body.clone(),
            problem_type: problem_type(&lost.body),
            ..Seen::default()
        };
        let linked = same_operation(&[&lost_seen, &retry]);
        let result =
            if retry.complete() && retry.status == lost_seen.status && retry.body == lost_seen.body
            {
                Verdict::Pass(format!(
                    "the lost {} came back byte for byte{}",
                    lost.status,
                    if retry.replayed {
                        " (Idempotent-Replayed: true)"
                    } else {
                        ""
                    }
                ))
            } else if retry.is_state() {
                Verdict::Pass(format!("the state of the operation: {}", retry.describe()))
            } else {
                Verdict::Fail(format!(
                    "the lost answer was {}, the retry got {}{}",
                    lost.status,
                    retry.describe(),
                    if retry.status == lost_seen.status {
                        " with another body: not the stored result"
                    } else {
                        ""
                    }
                ))
            };
        Ok((vec![lost_seen, retry], [one, linked, result]))
    }

    /// The operation refuses with `status` (the test fault); the same request again,
    /// without the fault.
    async fn refused(&self, key: &str, before: u64, status: u16) -> Result<Outcome, HarnessError> {
        let fault = TestFault::Answer(status);
        let first = self.send(&self.base, key, Some(fault)).await;
        let mid = self.count().await?.saturating_sub(before);
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
            Verdict::Fail(format!("{mid} effect(s) behind the {status} refusal"))
        } else if permanent {
            exactly(after, 0, "a permanent 400 and its retry with one key")
        } else {
            exactly(after, 1, &format!("a {status} and its retry with one key"))
        };
        let linked = same_operation(&[&first, &retry]);
        let result = if first.status != Some(status) {
            Verdict::Fail(format!(
                "the fault `{}` was not answered {status}: got {}",
                fault.header_value(),
                first.describe()
            ))
        } else if !permanent && first.retry_after.is_none() {
            Verdict::Fail(format!("the {status} has no Retry-After"))
        } else if permanent {
            if retry.complete() && retry.status == Some(400) && retry.body == first.body {
                Verdict::Pass(format!(
                    "the 400 is final: replayed to the retry{}",
                    if retry.replayed {
                        " (Idempotent-Replayed: true)"
                    } else {
                        ""
                    }
                ))
            } else {
                Verdict::Fail(format!(
                    "the permanent 400 was not replayed: the retry got {}",
                    retry.describe()
                ))
            }
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
        };
        Ok((vec![first, retry], [one, linked, result]))
    }

    /// Concurrent requests with one key, then one more once they have all answered.
    async fn concurrent(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let n = self.harness.concurrency;
        let all = futures_util::future::join_all((0..n).map(|_| self.send(&self.base, key, None)));
        let mut answers = all.await;
        let last = self.settled(key).await;
        let effects = self.count().await?.saturating_sub(before);
        let one = exactly(effects, 1, &format!("{n} requests with one key at once"));
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
        let result = if !other.is_empty() {
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
                "one result in {answered} answer(s) ({replayed} replayed), {states} state answer(s) (409/202 with Retry-After), then {}",
                last.describe()
            ))
        };
        answers.push(last);
        let refs: Vec<&Seen> = answers.iter().collect();
        let linked = same_operation(&refs);
        Ok((answers, [one, linked, result]))
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
        let linked = same_operation(&refs);
        let first = &answers[0];
        let last = answers.last().unwrap_or(first);
        let result = if first.complete() {
            Verdict::Fail(format!(
                "the fault `crash-after-effect` was not honoured: the first request got {}",
                first.describe()
            ))
        } else if last.success() {
            Verdict::Pass(format!(
                "recovery decided within {} ms: {} after {} state answer(s)",
                took.as_millis(),
                last.describe(),
                answers.len() - 2
            ))
        } else if last.is_parked() {
            Verdict::Pass(format!(
                "recovery could not decide within {} ms: the state of the operation, {} (parked for an operator), after {} state answer(s)",
                took.as_millis(),
                last.describe(),
                answers.len() - 2
            ))
        } else if last.is_state() {
            Verdict::Fail(format!(
                "no result within {} ms: still {} after {} retries (the key is blocked)",
                took.as_millis(),
                last.describe(),
                answers.len() - 1
            ))
        } else {
            Verdict::Fail(format!(
                "after the crash the retry got {}, not the result",
                last.describe()
            ))
        };
        Ok((answers, [one, linked, result]))
    }
}

/// Proof 2 with what the status lookup says: it names the answers' operation; after a
/// crash (whose attempt sent no answer, so no `Operation-Id`) it alone shows that the
/// retries continued the crashed attempt's operation: its attempt count is 2 or more.
fn with_lookup(
    scenario: Scenario,
    linked: Verdict,
    answers: &[Seen],
    lookup: Option<&serde_json::Value>,
) -> Verdict {
    let Verdict::Pass(evidence) = linked else {
        return linked;
    };
    let crash = scenario == Scenario::Crash;
    let Some(found) = lookup else {
        return if crash {
            Verdict::NotChecked(format!(
                "{evidence}, but the crashed attempt sent none: its link to the retries shows only in a status lookup (Harness::status_lookup)"
            ))
        } else {
            Verdict::Pass(evidence)
        };
    };
    let id = found.get("operation_id").and_then(|v| v.as_str());
    let first = answers.iter().find_map(|a| a.operation_id.as_deref());
    if let (Some(id), Some(first)) = (id, first)
        && id != first
    {
        return Verdict::Fail(format!(
            "{evidence}, but the status lookup names operation {id}"
        ));
    }
    if crash {
        match found.get("attempt").and_then(serde_json::Value::as_u64) {
            Some(n) if n >= 2 => {}
            Some(n) => {
                return Verdict::Fail(format!(
                    "{evidence}, but the status lookup counts {n} attempt(s): the crashed attempt is not part of this operation"
                ));
            }
            None => {
                return Verdict::NotChecked(format!(
                    "{evidence}; the status lookup gives no attempt count, so the crashed attempt's link is not shown"
                ));
            }
        }
    }
    Verdict::Pass(format!("{evidence}; {}", lookup_summary(found)))
}

/// The answers, and the verdicts on proofs 1 to 3.
type Outcome = (Vec<Seen>, [Verdict; 3]);

fn exactly(effects: u64, expected: u64, what: &str) -> Verdict {
    if effects == expected {
        Verdict::Pass(format!("{effects} effect(s) for {what}"))
    } else {
        Verdict::Fail(format!(
            "{effects} effect(s) for {what}, expected {expected}"
        ))
    }
}

/// Every complete answer carries one and the same `Operation-Id`.
fn same_operation(answers: &[&Seen]) -> Verdict {
    let complete: Vec<&&Seen> = answers.iter().filter(|a| a.complete()).collect();
    if complete.is_empty() {
        return Verdict::Fail("no complete answer to link".into());
    }
    if let Some(missing) = complete.iter().find(|a| a.operation_id.is_none()) {
        return Verdict::Fail(format!(
            "an answer ({}) has no Operation-Id",
            missing.describe()
        ));
    }
    let mut ids: Vec<&str> = complete
        .iter()
        .filter_map(|a| a.operation_id.as_deref())
        .collect();
    ids.dedup();
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > 1 {
        return Verdict::Fail(format!(
            "{} answers under {} different Operation-Ids: {}",
            complete.len(),
            distinct.len(),
            distinct.join(", ")
        ));
    }
    Verdict::Pass(format!(
        "{} answers under one Operation-Id {}",
        complete.len(),
        distinct[0]
    ))
}

fn ids_summary(ids: &[String]) -> String {
    match ids {
        [] => "no Operation-Id".into(),
        [one] => format!("Operation-Id {one}"),
        many => format!("{} Operation-Ids", many.len()),
    }
}

fn lookup_summary(found: &serde_json::Value) -> String {
    format!(
        "status lookup: state {}, attempt {}",
        found.get("state").and_then(|v| v.as_str()).unwrap_or("?"),
        found
            .get("attempt")
            .map_or_else(|| "?".into(), |v| v.to_string())
    )
}

fn new_key() -> String {
    format!("monday-{}", uuid::Uuid::now_v7())
}
