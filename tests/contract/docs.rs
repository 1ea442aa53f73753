//! The README and `docs/` hold together: every relative link points at a file that exists (and,
//! with a `#fragment`, at one of that file's headings, as GitHub names their anchors), and every
//! `joist` command they show (in `sh` blocks, and after `$ ` in printed sessions) is one that
//! `joist --help` lists, down to its subcommand.

use std::{
    collections::{BTreeSet, HashSet},
    path::{Path, PathBuf},
    process::Command,
};

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

use crate::tools::root;

/// README.md and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let docs = std::fs::read_dir(root().join("docs")).unwrap_or_else(|e| panic!("docs/: {e}"));
    for entry in docs {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

fn text_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings.
fn anchors(text: &str) -> HashSet<String> {
    let mut found = HashSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(piece) | Event::Code(piece) => {
                if let Some(heading) = heading.as_mut() {
                    heading.push_str(&piece);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some(heading) = heading.take() {
                    found.insert(anchor(&heading));
                }
            }
            _ => {}
        }
    }
    found
}

/// The destinations of a page's links.
fn links(text: &str) -> Vec<String> {
    Parser::new(text)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. }) => Some(dest_url.into_string()),
            _ => None,
        })
        .collect()
}

/// The command lines a page shows: every line of an `sh` block, and the lines after `$ ` of other
/// blocks (sessions as they printed).
fn command_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut block: Option<bool> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(language))) => {
                block = Some(language.as_ref() == "sh");
            }
            Event::Start(Tag::CodeBlock(CodeBlockKind::Indented)) => block = Some(false),
            Event::End(TagEnd::CodeBlock) => block = None,
            Event::Text(piece) => match block {
                Some(true) => lines.extend(piece.lines().map(str::to_owned)),
                Some(false) => lines.extend(
                    piece
                        .lines()
                        .filter_map(|l| l.strip_prefix("$ "))
                        .map(str::to_owned),
                ),
                None => {}
            },
            _ => {}
        }
    }
    lines
}

/// The subcommand words of a line that runs joist: after `joist`, or after `cargo run … --`.
fn joist_words(line: &str) -> Option<Vec<String>> {
    let line = line.trim().trim_start_matches("$ ");
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let start = tokens
        .iter()
        .position(|t| *t == "joist")
        .map(|i| i + 1)
        .or_else(|| {
            let cargo = tokens.windows(2).position(|w| w == ["cargo", "run"])?;
            tokens[cargo..]
                .iter()
                .position(|t| *t == "--")
                .map(|i| cargo + i + 1)
        })?;
    let words: Vec<String> = tokens[start..]
        .iter()
        .take_while(|t| t.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !t.starts_with('-'))
        .map(|t| (*t).to_owned())
        .collect();
    (!words.is_empty()).then_some(words)
}

/// The subcommands `joist ARGS --help` lists.
fn subcommands(args: &[String]) -> BTreeSet<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("run joist: {e}"));
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn every_link_of_the_readme_and_docs_points_at_a_page_and_heading_that_exist() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = text_of(&page);
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap_or(root()).join(path)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            let is_page = target.extension().is_some_and(|e| e == "md");
            if !fragment.is_empty() && is_page && !anchors(&text_of(&target)).contains(fragment) {
                broken.push(format!("{}: {link}: no such heading", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_joist_command_the_readme_and_docs_show_is_in_joist_help() {
    let top = subcommands(&[]);
    assert!(
        top.contains("simulate"),
        "joist --help lists no commands: {top:?}"
    );
    let mut unknown = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for line in command_lines(&text_of(&page)) {
            let Some(words) = joist_words(&line) else {
                continue;
            };
            checked += 1;
            if !top.contains(&words[0]) {
                unknown.push(format!("{}: {line}", page.display()));
                continue;
            }
            let nested = subcommands(&words[..1]);
            if let Some(second) = words.get(1)
                && !nested.is_empty()
                && !nested.contains(second)
            {
                unknown.push(format!("{}: {line}", page.display()));
            }
        }
    }
    assert!(checked > 10, "only {checked} joist commands found in the pages");
    assert!(
        unknown.is_empty(),
        "commands joist does not have:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_readme_is_one_screen_that_opens_with_the_two_commands() {
    let text = text_of(&root().join("README.md"));
    assert!(
        text.lines().count() <= 250,
        "README.md has {} lines",
        text.lines().count()
    );
    let commands = command_lines(&text);
    assert_eq!(
        commands.get(..2),
        Some(
            &[
                "cargo run --release -- simulate examples/quickstart.yaml".to_owned(),
                "./scripts/test".to_owned()
            ][..]
        ),
        "the README opens with the main job and the test suite"
    );
}
