//! The report in a real browser: headless Chromium (Debian's `chromium`)
//! opens the report of a stopped and resumed run, with and without GPU
//! statistics, takes a screenshot and dumps the DOM. Any console message
//! (the page has no script, so any is an error) or failed load fails the test,
//! as does a missing, wrongly sized or blank-looking screenshot.
//!
//! Needs `chromium` (`make deps` installs it; `REKINDLE_CHROMIUM` names
//! another binary). Without it the tests fail, unless
//! `REKINDLE_SKIP_CHROMIUM=1` outside CI, which turns them into a loud
//! SKIPPED. With `REKINDLE_REPORT_SCREENSHOT=FILE.png` the screenshot of the
//! run without GPU statistics is also copied there (how docs/report.png is
//! made).

use crate::support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::runs::{expect_exit, rekindle, three_attempt_run};

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 2000;
/// Longest a headless Chromium call may take before the test kills it.
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(90);

/// What a headless Chromium call left behind.
struct Headless {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs headless Chromium on `url` with a fresh profile and `extra` flags.
fn headless(chromium: &Path, url: &str, extra: &[String]) -> Headless {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", chromium.display()));
    let mut stdout_pipe = child.stdout.take().unwrap();
    let mut stderr_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout_pipe.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if started.elapsed() > CHROMIUM_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {CHROMIUM_TIMEOUT:?} on {url}:\n{}", err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Headless { success: status.success(), stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// Lines of Chromium's log that say the page failed: a console message (a
/// script error; the report has no script, so any message is one) or a
/// failed load.
fn page_problems(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.contains(":CONSOLE")
                || l.contains("Uncaught")
                || l.contains("Page load failed")
                || l.contains("net::ERR_")
        })
        .collect()
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.canonicalize().expect("absolute path").display())
}

/// Screenshots `page` into `png`; panics on a page error.
fn screenshot(chromium: &Path, page: &Path, png: &Path) -> Vec<u8> {
    let run = headless(
        chromium,
        &file_url(page),
        &[format!("--screenshot={}", png.display()), format!("--window-size={WIDTH},{HEIGHT}")],
    );
    assert!(run.success, "chromium failed on {}:\n{}", page.display(), run.stderr);
    let problems = page_problems(&run.stderr);
    assert!(problems.is_empty(), "page errors in {}:\n{}", page.display(), problems.join("\n"));
    let bytes = std::fs::read(png).unwrap_or_else(|e| panic!("no screenshot {}: {e}\n{}", png.display(), run.stderr));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    // IHDR: width and height, big-endian, right after the chunk header.
    let dim = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!((dim(16), dim(20)), (WIDTH, HEIGHT), "screenshot size");
    bytes
}

/// The page as Chromium parsed it.
fn dump_dom(chromium: &Path, page: &Path) -> String {
    let run = headless(chromium, &file_url(page), &["--dump-dom".to_string()]);
    assert!(run.success, "chromium --dump-dom failed:\n{}", run.stderr);
    let problems = page_problems(&run.stderr);
    assert!(problems.is_empty(), "page errors:\n{}", problems.join("\n"));
    run.stdout
}

#[test]
fn reports_render_in_headless_chromium_without_page_errors() {
    let Some(chromium) = support::requires::chromium() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let blank = tmp.path().join("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><head><title>blank</title></head><body></body></html>").unwrap();
    let blank_png = screenshot(&chromium, &blank, &tmp.path().join("blank.png"));

    let run = tmp.path().join("run");
    three_attempt_run(&run);
    let with_gpu = tmp.path().join("run-gpu");
    support::runs::copy_tree(&run, &with_gpu);
    std::fs::write(
        with_gpu.join("gpu_stats.jsonl"),
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["loss"].is_number())
            .map(|m| {
                let step = m["step"].as_u64().unwrap();
                format!(
                    "{}\n",
                    serde_json::json!({"time": m["time"], "devices": [{"vendor": "nvidia", "index": 0,
                        "utilization_pct": 50 + step % 40, "memory_used_mib": 1000 + step, "memory_total_mib": 8000}]})
                )
            })
            .collect::<String>(),
    )
    .unwrap();

    for (dir, gpu) in [(&run, false), (&with_gpu, true)] {
        expect_exit(rekindle().arg("report").arg(dir), 0);
        let page = dir.join("report.html");
        let png = dir.join("report.png");
        let bytes = screenshot(&chromium, &page, &png);
        // Charts and tables compress far worse than an empty page.
        assert!(
            bytes.len() > 5 * blank_png.len(),
            "the screenshot of {} looks blank: {} bytes, an empty page {} bytes",
            page.display(),
            bytes.len(),
            blank_png.len()
        );
        let dom = dump_dom(&chromium, &page);
        for id in ["chart-loss", "chart-lr", "chart-throughput", "attempts", "checkpoints", "events"] {
            assert!(dom.contains(&format!("id=\"{id}\"")), "{id} missing from the rendered DOM");
        }
        assert_eq!(dom.contains("id=\"chart-gpu-util\""), gpu, "GPU chart presence in {}", page.display());
        assert!(dom.matches("<svg").count() >= if gpu { 5 } else { 3 }, "SVG charts in the rendered DOM");

        if !gpu && let Some(dest) = std::env::var_os("REKINDLE_REPORT_SCREENSHOT") {
            std::fs::copy(&png, &dest).unwrap_or_else(|e| panic!("copy the screenshot to {dest:?}: {e}"));
            eprintln!("screenshot copied to {}", Path::new(&dest).display());
        }
    }
}

#[test]
fn a_script_error_or_a_missing_page_counts_as_a_page_error() {
    let Some(chromium) = support::requires::chromium() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.html");
    std::fs::write(&bad, "<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();</script></body></html>")
        .unwrap();
    let run = headless(&chromium, &file_url(&bad), &["--dump-dom".to_string()]);
    assert!(!page_problems(&run.stderr).is_empty(), "a script error went unnoticed:\n{}", run.stderr);

    let missing = format!("file://{}/missing.html", tmp.path().display());
    let png = tmp.path().join("missing.png");
    let run = headless(&chromium, &missing, &[format!("--screenshot={}", png.display())]);
    assert!(!page_problems(&run.stderr).is_empty(), "a failed load went unnoticed:\n{}", run.stderr);
}
