//! `joist simulate --html`, the real binary, and the page it writes rendered by headless Chromium
//! (Debian's package, installed by `scripts/chromium`) as a person would open it: no console
//! error, the charts drawn on screen, and the tables naming every launch, removal and pending pod.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::tools::{installed, path, root, succeeded};

/// Headless Chromium with console messages logged to stderr.
struct Chromium(PathBuf);

impl Chromium {
    fn installed() -> Self {
        Self(path(&installed("chromium"), "chromium", "CHROMIUM"))
    }

    /// Runs Chromium on `page` with `args` (`--dump-dom`, `--screenshot=…`).
    fn render(&self, page: &Path, args: &[&str]) -> Output {
        let mut command = Command::new(&self.0);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--enable-logging=stderr",
                "--v=0",
            ])
            .args(["--window-size=1200,1800", "--hide-scrollbars"])
            .args(args)
            .arg(format!("file://{}", page.display()));
        succeeded(&mut command, "chromium")
    }
}

/// The console messages Chromium logged (`…:CONSOLE:…] "message", source: …`).
fn console_messages(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| line.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect()
}

/// How many pixels of the screenshot are exactly `rgb`.
fn pixels_of(png: &Path, rgb: [u8; 3]) -> usize {
    let file = std::fs::File::open(png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().unwrap_or_else(|e| panic!("{e}"));
    let mut buffer = vec![0; reader.output_buffer_size().unwrap_or_default()];
    let frame = reader.next_frame(&mut buffer).unwrap_or_else(|e| panic!("{e}"));
    let channels = frame.color_type.samples();
    buffer[..frame.buffer_size()]
        .chunks_exact(channels)
        .filter(|pixel| pixel[..3] == rgb)
        .count()
}

#[test]
fn the_html_report_renders_its_charts_in_chromium_without_a_console_error() {
    let dir = std::env::temp_dir().join(format!("joist-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let page = dir.join("report.html");
    let output = succeeded(
        Command::new(env!("CARGO_BIN_EXE_joist"))
            .arg("simulate")
            .arg(root().join("examples/quickstart.yaml"))
            .arg("--html")
            .arg(&page),
        "joist simulate --html",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("html report: {}", page.display())),
        "the summary says where the page went: {stdout}"
    );
    let chromium = Chromium::installed();

    // The check can fail: a page with a script error is caught.
    let broken = dir.join("broken.html");
    std::fs::write(
        &broken,
        "<!DOCTYPE html><p>x</p><script>undefinedFunction();</script>",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let logged = console_messages(&chromium.render(&broken, &["--dump-dom"]));
    assert!(
        logged.iter().any(|line| line.contains("undefinedFunction")),
        "chromium logs console errors to stderr: {logged:?}"
    );

    let rendered = chromium.render(&page, &["--dump-dom"]);
    assert_eq!(
        console_messages(&rendered),
        Vec::<String>::new(),
        "no console message"
    );
    let dom = String::from_utf8_lossy(&rendered.stdout);
    for chart in ["chart-nodes", "chart-pods", "chart-cost"] {
        assert!(dom.contains(&format!("id=\"{chart}\"")), "{chart} is on the page");
    }
    // The quickstart's two launches, how each ended, and the per-type breakdown.
    for text in [
        "c6a.2xlarge",
        "c6a.8xlarge",
        "underutilized",
        "empty",
        "By NodePool",
        "By instance type",
        "Launches and removals",
        "Every pod was running or done.",
    ] {
        assert!(dom.contains(text), "the page shows {text:?}");
    }

    let screenshot = dir.join("report.png");
    let shot = chromium.render(&page, &[&format!("--screenshot={}", screenshot.display())]);
    assert_eq!(console_messages(&shot), Vec::<String>::new());
    // Each chart's line is drawn 2 px wide across most of its 930 px: far more pixels of its
    // colour than its legend's swatch (about 11 × 11).
    for (series, rgb) in [
        ("nodes", [0x25, 0x63, 0xeb]),
        ("pods running", [0x16, 0xa3, 0x4a]),
        ("cost", [0x93, 0x33, 0xea]),
    ] {
        let drawn = pixels_of(&screenshot, rgb);
        assert!(
            drawn > 1000,
            "the {series} line is on the screenshot: {drawn} pixels"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_that_stays_to_the_end_says_why_in_both_reports() {
    let dir = std::env::temp_dir().join(format!("joist-stays-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let (page, report) = (dir.join("report.html"), dir.join("report.json"));
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_joist"))
            .arg("simulate")
            .arg(root().join("examples/consolidation.yaml"))
            .arg("--html")
            .arg(&page)
            .arg("--report")
            .arg(&report),
        "joist simulate --html --report",
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
    let finals = json["summary"]["final_nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no final nodes: {json:#}"));
    // The one node left runs what remains of the workload; no cheaper type would hold it.
    let stays = finals[0]["stays"].as_str().unwrap_or_default();
    assert!(
        stays.ends_with("(blocker: same_or_more_expensive_replacement)"),
        "{finals:#?}"
    );
    let html = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{e}"));
    assert!(html.contains("why it ended, or stays"), "the column says so");
    assert!(
        html.contains("a candidate that stays: the cheapest replacement"),
        "the node's row says why it stayed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
