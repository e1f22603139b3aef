//! The HTML docs as a reader sees them: the page of the orders example
//! (`examples/orders`: its contract from the source, merged into its own OpenAPI
//! document with its client identity header) is opened in headless Chromium, and the
//! screenshot must show the lost-answer sequence diagram: a region of the diagram's
//! background of the size its SVG declares, with lines and text drawn on it, the lost
//! answer's red and the replay's green among them.
//!
//! Without Chromium the test says it was skipped, except under `CI=true`, where a skip is
//! a failure (`.ci/run` installs it). `IDEM_CHROMIUM` names another binary. The
//! screenshot and a crop of the diagram stay in the target folder for a person to look
//! at: `target/tmp/docs-screenshot/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem_codegen::docs::{self, DocFormat, OperationInfo};
use idem_codegen::openapi::{self, Document, MergeOptions, find_operation};
use idem_codegen::{contracts, extension};

/// The viewport: wide enough for the page's full width, tall enough for the whole page.
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 9000;

/// The diagram's colours in the light scheme (`templates/docs.html`).
const BACKGROUND: [u8; 3] = [0xf7, 0xf9, 0xfc];
const LOST: [u8; 3] = [0xc6, 0x28, 0x28];
const REPLAY: [u8; 3] = [0x1b, 0x7f, 0x3b];

/// Whether a skipped test must fail (`CI` is `true` or `1`), as for the PostgreSQL tests.
fn skips_fail() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The Chromium binary: `IDEM_CHROMIUM`, or the first of the usual names on `PATH`.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("IDEM_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The HTML docs of the orders example, as `idem merge --identity-header X-Client-Id`
/// followed by `idem docs --spec` on the merged document make them.
fn orders_page() -> String {
    let examples = repo().join("examples/orders");
    let found = contracts::from_sources(&[examples.join("src/api.rs")]).unwrap();
    let mut doc = Document::load(&examples.join("openapi.yaml")).unwrap();
    let options = MergeOptions::new()
        .with_client_identity(extension::parse_identity_header("X-Client-Id").unwrap());
    openapi::merge_with(&mut doc, &found, &options).unwrap();
    let operations: Vec<_> = found
        .into_iter()
        .map(|s| {
            let op = find_operation(&doc, &s.target).unwrap();
            (s.contract, OperationInfo::from_document(&doc, &op))
        })
        .collect();
    docs::render(
        DocFormat::Html,
        &docs::default_title(Some(&doc)),
        &operations,
    )
    .unwrap()
}

/// Runs `command`, killed after `limit`.
fn run_with_limit(mut command: Command, limit: Duration) -> std::process::Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("Chromium starts");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().ok();
            let out = child.wait_with_output().unwrap();
            panic!(
                "Chromium did not finish within {limit:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A decoded RGB(A) image.
struct Image {
    width: u32,
    height: u32,
    channels: usize,
    data: Vec<u8>,
}

impl Image {
    fn load(path: &Path) -> Image {
        let decoder =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut data = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut data).unwrap();
        data.truncate(info.buffer_size());
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("unexpected screenshot colour type {other:?}"),
        };
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        Image {
            width: info.width,
            height: info.height,
            channels,
            data,
        }
    }

    fn rgb(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y as usize * self.width as usize + x as usize) * self.channels;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }

    /// The smallest box holding every pixel of colour `c`: `(left, top, right, bottom)`,
    /// inclusive.
    fn bounds_of(&self, c: [u8; 3]) -> Option<(u32, u32, u32, u32)> {
        let mut bounds: Option<(u32, u32, u32, u32)> = None;
        for y in 0..self.height {
            for x in 0..self.width {
                if self.rgb(x, y) == c {
                    bounds = Some(match bounds {
                        None => (x, y, x, y),
                        Some((l, t, r, b)) => (l.min(x), t.min(y), r.max(x), b.max(y)),
                    });
                }
            }
        }
        bounds
    }

    /// The pixels of the box that are `c`.
    fn count(&self, (l, t, r, b): (u32, u32, u32, u32), c: impl Fn([u8; 3]) -> bool) -> usize {
        (t..=b)
            .flat_map(|y| (l..=r).map(move |x| (x, y)))
            .filter(|&(x, y)| c(self.rgb(x, y)))
            .count()
    }

    /// Writes the box as a PNG of its own.
    fn save_crop(&self, (l, t, r, b): (u32, u32, u32, u32), path: &Path) {
        let (w, h) = (r - l + 1, b - t + 1);
        let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
        let mut encoder = png::Encoder::new(file, w, h);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().unwrap();
        let mut data = Vec::with_capacity((w * h * 3) as usize);
        for y in t..=b {
            for x in l..=r {
                data.extend_from_slice(&self.rgb(x, y));
            }
        }
        writer.write_image_data(&data).unwrap();
    }
}

/// The diagram's size as its SVG declares it: `viewBox="0 0 W H"`.
fn declared_size(html: &str) -> (u32, u32) {
    let at = html
        .find("<figure class=\"seq\">")
        .expect("the page has the diagram");
    let rest = &html[at..];
    let view_box = rest
        .split("viewBox=\"0 0 ")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("the diagram's viewBox");
    let mut numbers = view_box.split(' ').map(|n| n.parse::<u32>().unwrap());
    (numbers.next().unwrap(), numbers.next().unwrap())
}

#[test]
fn the_lost_answer_diagram_is_drawn_in_headless_chromium() {
    let html = orders_page();
    // Inline SVG only: no script, and nothing fetched from anywhere.
    for external in [
        "<script",
        "<link",
        "<img",
        "src=",
        "href=\"http",
        "@import",
        "url(",
    ] {
        assert!(!html.contains(external), "the page refers to `{external}`");
    }
    let (svg_width, svg_height) = declared_size(&html);

    let Some(chromium) = chromium() else {
        assert!(
            !skips_fail(),
            "Chromium is not installed (`apt-get install chromium`, or set IDEM_CHROMIUM); under CI=true a skipped screenshot test is a failure"
        );
        eprintln!(
            "skipped the_lost_answer_diagram_is_drawn_in_headless_chromium: Chromium is not installed (apt-get install chromium, or set IDEM_CHROMIUM)"
        );
        return;
    };

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs-screenshot");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("operations.html");
    std::fs::write(&page, &html).unwrap();
    let shot = dir.join("operations.png");
    let _ = std::fs::remove_file(&shot);
    let profile = tempfile::tempdir().unwrap();
    let mut command = Command::new(&chromium);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--force-color-profile=srgb",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={WIDTH},{HEIGHT}"))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()));
    let out = run_with_limit(command, Duration::from_secs(120));
    assert!(
        out.status.success() && shot.is_file(),
        "Chromium took no screenshot ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    let image = Image::load(&shot);
    assert_eq!((image.width, image.height), (WIDTH, HEIGHT));
    let bounds = image
        .bounds_of(BACKGROUND)
        .expect("the screenshot shows no diagram background");
    let (l, t, r, b) = bounds;
    image.save_crop(bounds, &dir.join("diagram.png"));
    // The SVG is drawn at its own size (the page is wider than it), all of it on screen.
    let (w, h) = (r - l + 1, b - t + 1);
    assert!(
        w.abs_diff(svg_width) <= 2 && h.abs_diff(svg_height) <= 2,
        "the diagram's background is {w}×{h} at ({l}, {t}); its SVG says {svg_width}×{svg_height} (see {})",
        shot.display()
    );
    assert!(
        b + 1 < HEIGHT,
        "the diagram reaches the bottom of the screenshot: make HEIGHT larger"
    );
    // Something is drawn on it: lane boxes, lifelines, arrows, labels.
    let area = (w * h) as usize;
    let drawn = image.count(bounds, |c| c != BACKGROUND);
    assert!(
        drawn * 100 > area * 4,
        "only {drawn} of the diagram's {area} pixels are drawn on (see {})",
        shot.display()
    );
    let dark = image.count(bounds, |c| c.iter().all(|&v| v < 90));
    assert!(
        dark > 2000,
        "the diagram has almost no text ({dark} dark pixels)"
    );
    // The lost answer in red, the replay in green.
    let near = |want: [u8; 3]| {
        move |c: [u8; 3]| {
            c.iter()
                .zip(want)
                .all(|(&got, want)| got.abs_diff(want) <= 12)
        }
    };
    let lost = image.count(bounds, near(LOST));
    let replay = image.count(bounds, near(REPLAY));
    assert!(
        lost > 100,
        "the lost answer is not drawn ({lost} red pixels)"
    );
    assert!(
        replay > 100,
        "the replay is not drawn ({replay} green pixels)"
    );
    eprintln!(
        "the diagram: {w}×{h} at ({l}, {t}), {drawn} pixels drawn, {lost} red, {replay} green; {} and {}",
        shot.display(),
        dir.join("diagram.png").display()
    );
}
