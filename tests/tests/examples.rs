//! The examples of the README and the guide, run, and their links, followed: every
//! ```` ```console ```` block of `README.md`, `docs/*.md` and `docs/reference/*.md` is a transcript, and this test types
//! each of its commands into a shell against the real `payments-api`, `payments-worker` and
//! `processor-sim` binaries (on free ports, over a fresh database, as `make run` starts them), then
//! checks what the transcript says the command prints. An example that stops working fails `make
//! test`. So does a relative link or heading anchor that leads nowhere, a file of the repository
//! named without a link, and a Rust item named in a paragraph that links to no source file.
//!
//! The transcript format, which `docs/reference/transcripts.md` explains to readers:
//! - `$ command` is typed into one `bash` per Markdown file (so `B=…` set in one command holds in
//!   the next); a line ending in `\` continues on the next one. `KEY` holds a fresh account's
//!   secret key, as `make run` prints one. `http://127.0.0.1:8080`, `127.0.0.1:12111` and
//!   `postgres://postgres@127.0.0.1:5432/payments` are replaced by the test's API, stand-in
//!   processor and database, another database on `postgres://postgres@127.0.0.1:5432/` by that
//!   name on the test's server, and `127.0.0.1:8090` (the crash demo's API) and `127.0.0.1:4242`
//!   (the example webhook receiver) by free ports, in commands and output. `make demo-crash`
//!   finds the binaries `make test` built (`PAYMENTS_DEMO_BIN`) and builds nothing; so does
//!   `cargo run -p payments-client --example NAME`, which runs `target/debug/examples/NAME`. The
//!   shell's `PAYMENTS_API`, `SIM_URL` and `PORT` point the client's examples at the test's
//!   servers instead of their defaults (8080, 12111, 4242).
//! - A command ending in `&` runs in the background until the file's last transcript ends, as a
//!   server in another terminal would; the lines shown under it are what it prints once it is
//!   ready, and the next command waits for them. When the file is done, everything its shell
//!   started is killed.
//! - A line starting with `#` between commands is narration.
//! - Every other line is expected output. Each must match a line the command printed, in order
//!   (lines not shown are not checked): a status line or a header matches exactly, but for `…`,
//!   which stands for any text, and `$NAME`, which stands for the value the shell variable `NAME`
//!   holds, or, when nothing is bound to `NAME` yet, binds it (exported to the shell, so the
//!   next commands can use `$NAME`). A line starting with `{` or `[` is JSON, matched member by
//!   member with the same rules in every string; a bare `…` in an object or array stands for
//!   the members or elements not shown, and without it the object has exactly the members shown.
//! - A command that runs `curl` must show output, unless it redirects it (`>`); every command
//!   must exit 0. A command (`curl`, `psql`, `cargo run`) in a ```` ```sh ```` block or in a
//!   paragraph's code span is refused: it would not be run.
//!
//! Idempotency keys are used as written: each file gets an account of its own in a fresh
//! database, so the keys of one file never meet another's, and a key reused within a file means
//! what it says (a replay, a `409`, a `422`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use payments_tests::system::{Process, System, binary, free_port};
use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The stand-in for "anything" in expected output.
const ANY: char = '…';
/// The address the examples use for the API, as `make run` serves it.
const API_AS_WRITTEN: &str = "http://127.0.0.1:8080";
/// The stand-in processor's address, as `make run` starts it.
const SIM_AS_WRITTEN: [&str; 2] = ["127.0.0.1:12111", "localhost:12111"];
/// The crash demo's own ports (`scripts/demo-crash.sh`), so that it runs beside `make run`.
const DEMO_API_AS_WRITTEN: &str = "127.0.0.1:8090";
/// The example webhook receiver's address (`crates/client/examples/webhook_receiver.rs`).
const RECEIVER_AS_WRITTEN: &str = "127.0.0.1:4242";
/// The database `make run` uses by default.
const DATABASE_AS_WRITTEN: &str = "postgres://postgres@127.0.0.1:5432/payments";
/// The server of that database, before another database's name.
const DATABASE_SERVER_AS_WRITTEN: &str = "postgres://postgres@127.0.0.1:5432/";
/// How a reader runs an example of the client; the test runs the binary `make test` built.
const EXAMPLE_AS_WRITTEN: &str = "cargo run -p payments-client --example ";
/// Commands that a ```` ```sh ```` block or a code span must not hold: they would not be run.
const EXAMPLE_COMMANDS: [&str; 3] = ["curl ", "psql ", "cargo run "];
/// The inspector's operator token the API runs with here.
const INSPECTOR_TOKEN: &str = "examples-inspector-token";
/// How long one command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// One command of a transcript and what it should print.
#[derive(Debug)]
struct Step {
    line: usize,
    command: String,
    expected: Vec<String>,
    /// The command ends in `&`: it runs on, and `expected` is what it prints once ready.
    background: bool,
}

/// One ```` ```console ```` block.
#[derive(Debug)]
struct Transcript {
    file: String,
    steps: Vec<Step>,
}

/// The info string of a line that opens or closes a fenced code block (CommonMark: three or more
/// backticks, then an info string without backticks); `None` for any other line, such as one
/// that starts with a code span of backticks.
fn fence(line: &str) -> Option<&str> {
    let info = line.trim_start().strip_prefix("```")?.trim_start_matches('`');
    (!info.contains('`')).then(|| info.trim())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .into()
}

/// `README.md`, then `docs/*.md` and `docs/reference/*.md`, each folder in name order.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let in_folder = |folder: &str| {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(folder))
            .unwrap_or_else(|err| panic!("{folder}/ is readable: {err}"))
            .map(|entry| entry.expect("a folder's entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
            .collect();
        files.sort();
        files
    };
    let docs = in_folder("docs").into_iter().chain(in_folder("docs/reference"));
    std::iter::once(root.join("README.md")).chain(docs).collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// Every transcript of one Markdown text; `Err` for a block that breaks the format's rules.
fn transcripts(file: &str, text: &str) -> Result<Vec<Transcript>, String> {
    let mut found = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let Some(info) = fence(line) else { continue };
        let body: Vec<(usize, &str)> = lines
            .by_ref()
            .take_while(|(_, l)| fence(l) != Some(""))
            .map(|(i, l)| (i + 1, l))
            .collect();
        if info == "console" {
            found.push(parse_transcript(file, index + 1, &body)?);
        } else if (info == "sh" || info == "bash" || info == "shell")
            && let Some(command) =
                EXAMPLE_COMMANDS.iter().find(|c| body.iter().any(|(_, l)| runs(l, c)))
        {
            return Err(format!(
                "{file}:{}: a ```{info} block runs `{}`: write it as a ```console transcript with \
                 its expected output, so that this test runs it",
                index + 1,
                command.trim()
            ));
        }
    }
    Ok(found)
}

fn parse_transcript(file: &str, line: usize, body: &[(usize, &str)]) -> Result<Transcript, String> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continues = false;
    for (number, text) in body {
        if continues {
            let step = steps.last_mut().expect("a continued command exists");
            step.command.push('\n');
            step.command.push_str(text);
            continues = text.ends_with('\\');
        } else if let Some(command) = text.strip_prefix("$ ") {
            steps.push(Step {
                line: *number,
                command: command.to_owned(),
                expected: Vec::new(),
                background: false,
            });
            continues = command.ends_with('\\');
        } else if text.starts_with('#') || text.trim().is_empty() {
            // Narration, or a blank line.
        } else if let Some(step) = steps.last_mut() {
            step.expected.push((*text).to_owned());
        } else {
            return Err(format!("{file}:{number}: output before any `$ ` command"));
        }
    }
    for step in &mut steps {
        let command = step.command.trim_end();
        step.background = command.ends_with('&') && !command.ends_with("&&");
        // A command that sends its output elsewhere (`>/dev/null &`) has none to show.
        if step.command.contains("curl ") && !step.command.contains('>') && step.expected.is_empty()
        {
            return Err(format!(
                "{file}:{}: this curl command shows no expected output (its status line and the \
                 fields that matter)",
                step.line
            ));
        }
    }
    if steps.is_empty() {
        return Err(format!("{file}:{line}: a console block without a `$ ` command"));
    }
    Ok(Transcript { file: file.to_owned(), steps })
}

/// Whether a line of shell runs `command` (`"curl "`): at its start or after a space.
fn runs(line: &str, command: &str) -> bool {
    let line = line.trim_start();
    line.starts_with(command) || line.contains(&format!(" {command}"))
}

/// The code spans of a Markdown text's paragraphs that hold a command to run (`` `curl …` ``),
/// with their line: an example there is one that no transcript runs.
fn inline_commands(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 1 && EXAMPLE_COMMANDS.iter().any(|c| runs(piece, c)) {
                found.push((number, piece.to_owned()));
            }
        }
    }
    found
}

/// One piece of a text pattern.
#[derive(Debug, PartialEq)]
enum Piece {
    Text(char),
    Any,
    Var(String),
}

fn pieces(pattern: &str) -> Vec<Piece> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == ANY {
            out.push(Piece::Any);
        } else if c == '$' && chars.get(i + 1).is_some_and(char::is_ascii_uppercase) {
            let name: String = chars[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || **c == '_')
                .collect();
            i += name.len();
            out.push(Piece::Var(name));
        } else {
            out.push(Piece::Text(c));
        }
        i += 1;
    }
    out
}

/// Matches the whole of `text` against `pattern`; returns the variables it binds.
fn match_text(
    pattern: &str,
    text: &str,
    bound: &HashMap<String, String>,
) -> Option<HashMap<String, String>> {
    fn go(
        pieces: &[Piece],
        text: &[char],
        bound: &HashMap<String, String>,
        new: &mut HashMap<String, String>,
    ) -> bool {
        let Some((first, rest)) = pieces.split_first() else { return text.is_empty() };
        match first {
            Piece::Text(c) => text.first() == Some(c) && go(rest, &text[1..], bound, new),
            Piece::Any => (0..=text.len()).any(|n| go(rest, &text[n..], bound, new)),
            Piece::Var(name) => {
                if let Some(value) = bound.get(name).or_else(|| new.get(name)).cloned() {
                    let value: Vec<char> = value.chars().collect();
                    return text.starts_with(&value) && go(rest, &text[value.len()..], bound, new);
                }
                // Greedy, as a reader expects of `$PAY…`.
                for n in (1..=text.len()).rev() {
                    new.insert(name.clone(), text[..n].iter().collect());
                    if go(rest, &text[n..], bound, new) {
                        return true;
                    }
                }
                new.remove(name);
                false
            }
        }
    }
    let text: Vec<char> = text.chars().collect();
    let mut new = HashMap::new();
    go(&pieces(pattern), &text, bound, &mut new).then_some(new)
}

/// The expected JSON with each bare `…` made a marker: in an object the member `"…": true`, in
/// an array the element `"…"`.
fn json_pattern(expected: &str) -> Result<Value, String> {
    let mut out = String::new();
    let mut stack = Vec::new();
    let (mut in_string, mut escaped) = (false, false);
    for c in expected.chars() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
            out.push(c);
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => stack.push(c),
            '}' | ']' => {
                stack.pop();
            }
            ANY => {
                out.push_str(if stack.last() == Some(&'{') { "\"…\":true" } else { "\"…\"" });
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    serde_json::from_str(&out)
        .map_err(|err| format!("the expected JSON does not parse ({err}): {expected}"))
}

/// Matches an actual JSON value against a pattern made by `json_pattern`; binds into `new`.
fn match_json(
    pattern: &Value,
    actual: &Value,
    bound: &HashMap<String, String>,
    new: &mut HashMap<String, String>,
) -> bool {
    match (pattern, actual) {
        (Value::String(pattern), Value::String(actual)) => {
            let mut all = bound.clone();
            all.extend(new.clone());
            match match_text(pattern, actual, &all) {
                Some(binds) => {
                    new.extend(binds);
                    true
                }
                None => false,
            }
        }
        (Value::Object(pattern), Value::Object(actual)) => {
            let open = pattern.contains_key("…");
            let shown = pattern.keys().filter(|k| *k != "…").count();
            (open || shown == actual.len())
                && pattern.iter().filter(|(k, _)| *k != "…").all(|(key, value)| {
                    actual.get(key).is_some_and(|actual| match_json(value, actual, bound, new))
                })
        }
        (Value::Array(pattern), Value::Array(actual)) => {
            let open = pattern.last() == Some(&Value::String("…".into()));
            let shown = if open { &pattern[..pattern.len() - 1] } else { &pattern[..] };
            (if open { actual.len() >= shown.len() } else { actual.len() == shown.len() })
                && shown.iter().zip(actual).all(|(p, a)| match_json(p, a, bound, new))
        }
        (pattern, actual) => pattern == actual,
    }
}

/// Checks the expected lines against what a command printed, in order; returns the bindings.
fn check_output(
    expected: &[String],
    printed: &[String],
    bound: &HashMap<String, String>,
) -> Result<HashMap<String, String>, String> {
    let mut new = HashMap::new();
    let mut at = 0;
    for want in expected {
        let json = if want.starts_with('{') || want.starts_with('[') {
            Some(json_pattern(want)?)
        } else {
            None
        };
        let mut all = bound.clone();
        all.extend(new.clone());
        let found = printed[at..].iter().enumerate().find_map(|(offset, line)| {
            let binds = match &json {
                Some(pattern) => {
                    let actual: Value = serde_json::from_str(line).ok()?;
                    let mut binds = HashMap::new();
                    match_json(pattern, &actual, &all, &mut binds).then_some(binds)?
                }
                None => match_text(want, line, &all)?,
            };
            Some((offset, binds))
        });
        match found {
            Some((offset, binds)) => {
                at += offset + 1;
                new.extend(binds);
            }
            None => {
                return Err(format!(
                    "expected the line\n    {want}\nafter line {at} of what the command printed:\n    {}",
                    printed.join("\n    ")
                ));
            }
        }
    }
    Ok(new)
}

/// A `bash` that the commands of one Markdown file are typed into. It leads a process group of
/// its own, so that dropping it kills whatever its commands left running in the background.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// Where the output of background commands goes, removed with the shell.
    dir: PathBuf,
    backgrounds: usize,
}

/// A command started in the background: the file its output goes to, and the file its exit
/// status is written to once it ends.
struct Background {
    output: PathBuf,
    status: PathBuf,
}

const DONE: &str = "__EXAMPLE_COMMAND_DONE__";

impl Shell {
    fn start(env: &[(&str, String)]) -> Self {
        static SHELLS: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "payments-examples-{}-{}",
            std::process::id(),
            SHELLS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a directory for background output");
        let path = format!(
            "{}:{}",
            binary("payments-api").parent().expect("the binaries' directory").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("bash");
        command
            .args(["--noprofile", "--norc"])
            .current_dir(root())
            .env("PATH", path)
            .env_remove("RUST_LOG")
            // `make demo-crash` run from inside `make test` is not a sub-make of it.
            .env_remove("MAKEFLAGS")
            .env_remove("MAKELEVEL")
            .env_remove("MFLAGS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("bash starts");
        let stdin = child.stdin.take().expect("bash's input");
        let stdout = BufReader::new(child.stdout.take().expect("bash's output")).lines();
        Self { child, stdin, stdout, dir, backgrounds: 0 }
    }

    /// Types a command; returns its exit status and the lines it printed (standard error too).
    async fn run(&mut self, command: &str) -> Result<(i32, Vec<String>), String> {
        let script = format!("{{\n{command}\n}} 2>&1\nprintf '\\n{DONE} %s\\n' \"$?\"\n");
        self.stdin.write_all(script.as_bytes()).await.map_err(|e| format!("bash: {e}"))?;
        self.stdin.flush().await.map_err(|e| format!("bash: {e}"))?;
        let mut printed = Vec::new();
        let read = async {
            while let Some(line) = self.stdout.next_line().await.map_err(|e| e.to_string())? {
                if let Some(status) = line.strip_prefix(DONE) {
                    return Ok(status.trim().parse().unwrap_or(-1));
                }
                let line = line.trim_end_matches('\r');
                if !line.trim().is_empty() {
                    printed.push(line.to_owned());
                }
            }
            Err("bash exited".to_owned())
        };
        let status = tokio::time::timeout(COMMAND_TIMEOUT, read)
            .await
            .map_err(|_| format!("no end within {COMMAND_TIMEOUT:?}"))??;
        Ok((status, printed))
    }

    /// Starts a command that ends in `&`, its output and then its exit status going to files of
    /// their own; `wait` still waits for it, and it runs on until the shell is dropped.
    async fn start_background(&mut self, command: &str) -> Result<Background, String> {
        self.backgrounds += 1;
        let output = self.dir.join(format!("background-{}.out", self.backgrounds));
        let status = output.with_extension("status");
        let command = command.trim_end().strip_suffix('&').expect("a command ending in &");
        // In a subshell of its own, so that even an `exit` in it leaves its status behind.
        let script = format!(
            "{{ (\n{command}\n) >'{}' 2>&1; echo \"$?\" >'{}'; }} &",
            output.display(),
            status.display()
        );
        match self.run(&script).await? {
            (0, _) => Ok(Background { output, status }),
            (code, printed) => Err(format!("exited with {code}: {}", printed.join("\n"))),
        }
    }

    async fn export(&mut self, name: &str, value: &str) {
        let quoted = value.replace('\'', r"'\''");
        let (status, _) = self.run(&format!("export {name}='{quoted}'")).await.expect("export");
        assert_eq!(status, 0);
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // The whole group: bash, and every command still running in the background. Bash's
            // own `kill`, which is there wherever the transcripts can run.
            let _ = std::process::Command::new("bash")
                .args(["-c", r#"kill -KILL -- "-$0""#, &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Background {
    /// Waits until the command has printed the expected lines, checked as a command's output
    /// is (so it may bind variables); an error if it ends or a bound passes first.
    async fn ready(
        &self,
        expected: &[String],
        bound: &HashMap<String, String>,
    ) -> Result<HashMap<String, String>, String> {
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        loop {
            // The status before the output: a command that ended has printed all it will.
            let ended = std::fs::read_to_string(&self.status).ok();
            // Not there yet: the shell has not started the command. Any other error is one.
            let output = match std::fs::read_to_string(&self.output) {
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
                read => read.expect("the background command's output can be read"),
            };
            let printed: Vec<String> = output
                .lines()
                .map(|line| line.trim_end_matches('\r').to_owned())
                .filter(|line| !line.trim().is_empty())
                .collect();
            let err = match check_output(expected, &printed, bound) {
                Ok(binds) => return Ok(binds),
                Err(err) => err,
            };
            if let Some(status) = ended {
                return Err(format!("it ended (exit status {}) first: {err}", status.trim()));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("not within {COMMAND_TIMEOUT:?}: {err}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The addresses of the servers the examples run against, and of the programs they run, in
/// place of those written.
struct Addresses {
    database: String,
    /// The test's database server, with the `/` before a database's name.
    database_server: String,
    api: String,
    sim: String,
    demo_api: String,
    receiver: String,
    /// The directory of the client's example binaries, with a `/` after it.
    examples: String,
}

impl Addresses {
    fn apply(&self, text: &str) -> String {
        let mut text = text.replace(API_AS_WRITTEN, &self.api);
        for sim in SIM_AS_WRITTEN {
            text = text.replace(sim, self.sim.trim_start_matches("http://"));
        }
        text.replace(DEMO_API_AS_WRITTEN, &self.demo_api)
            .replace(RECEIVER_AS_WRITTEN, &self.receiver)
            .replace(DATABASE_AS_WRITTEN, &self.database)
            .replace(DATABASE_SERVER_AS_WRITTEN, &self.database_server)
            .replace(EXAMPLE_AS_WRITTEN, &self.examples)
    }
}

/// The client's examples (`crates/client/examples/NAME.rs`) by name.
fn client_examples() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("crates/client/examples"))
        .expect("crates/client/examples is readable")
        .map(|entry| entry.expect("an examples/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| path.file_stem().expect("a file name").to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces made hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a Markdown text outside its code blocks, numbered from 1; each fence reads as a
/// blank line, so that it ends a paragraph.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_code = false;
    let mut prose = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if fence(line).is_some() {
            in_code = !in_code;
            prose.push((index + 1, ""));
        } else if !in_code {
            prose.push((index + 1, line));
        }
    }
    prose
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> Vec<String> {
    prose_lines(text)
        .into_iter()
        .filter_map(|(_, line)| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect()
}

/// The targets of the inline links `[text](target)` of a Markdown text, with their line, outside
/// code blocks and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        let outside_spans: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = outside_spans.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push((number, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    found
}

/// The paths of this repository named in code spans (`` `crates/idem/src/store/claim.rs` ``) but not
/// as the text of a link, outside code blocks.
fn unlinked_paths(text: &str) -> Vec<(usize, String)> {
    const ROOTS: [&str; 5] = ["crates/", "tests/", "migrations/", "scripts/", "docs/"];
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        let mut position = 0;
        for (i, piece) in line.split('`').enumerate() {
            let before = line[..position].trim_end_matches('`');
            position += piece.len() + 1;
            let is_path = ROOTS.iter().any(|root| piece.starts_with(root))
                && !piece.contains(' ')
                && root().join(piece.trim_end_matches('/')).exists();
            if i % 2 == 1 && is_path && !before.ends_with('[') {
                found.push((number, piece.to_owned()));
            }
        }
    }
    found
}

/// Whether a code span names a Rust item by a path (`Lease::phase`, `store::take_over`).
fn is_rust_path(span: &str) -> bool {
    span.contains("::")
        && span.split("::").all(|segment| {
            segment.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && segment.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// Rust items named in code spans (`` `Lease::phase` ``) in a paragraph or a table row that links
/// to no source file, outside code blocks.
fn unlinked_items(text: &str) -> Vec<(usize, String)> {
    let mut blocks: Vec<Vec<(usize, &str)>> = vec![Vec::new()];
    for (number, line) in prose_lines(text) {
        let own_block = line.starts_with('|') || line.starts_with('#');
        if line.trim().is_empty() || own_block {
            blocks.push(Vec::new());
        }
        blocks.last_mut().expect("a block").push((number, line));
        if own_block {
            blocks.push(Vec::new());
        }
    }
    let mut found = Vec::new();
    for block in blocks {
        let joined: String = block.iter().map(|(_, line)| *line).collect::<Vec<_>>().join(" ");
        let links_source = links(&joined).iter().any(|(_, target)| {
            target
                .split('#')
                .next()
                .is_some_and(|file| file.ends_with(".rs") || file.contains("crates/"))
        });
        if links_source {
            continue;
        }
        for (number, line) in block {
            for (i, piece) in line.split('`').enumerate() {
                if i % 2 == 1 && is_rust_path(piece) {
                    found.push((number, piece.to_owned()));
                }
            }
        }
    }
    found
}

/// The Markdown files a reader of the repository sees: `README.md`, `BENCHMARKS.md`, every
/// `docs/**/*.md` and every `examples/**/README.md`, in name order.
fn public_docs() -> Vec<PathBuf> {
    fn walk(dir: &Path, wanted: &dyn Fn(&Path) -> bool, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, wanted, found);
            } else if wanted(&path) {
                found.push(path);
            }
        }
    }
    let root = root();
    let mut found: Vec<PathBuf> = ["README.md", "BENCHMARKS.md"]
        .iter()
        .map(|name| root.join(name))
        .filter(|path| path.exists())
        .collect();
    let markdown = |path: &Path| path.extension().is_some_and(|ext| ext == "md");
    walk(&root.join("docs"), &markdown, &mut found);
    let readme = |path: &Path| path.file_name().is_some_and(|name| name == "README.md");
    let mut examples = Vec::new();
    walk(&root.join("examples"), &readme, &mut examples);
    examples.retain(|path| !path.components().any(|part| part.as_os_str() == "node_modules"));
    found.extend(examples);
    found.sort();
    found
}

/// Whether `word` is a Rust identifier.
fn is_identifier(word: &str) -> bool {
    word.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The item a link's code span names, by its last segment: `Code::PaymentRequiresAction` names
/// `PaymentRequiresAction`, `settle()` names `settle`, `fail_point!` names the macro
/// `fail_point!`. `None` for a span that names no item (`make test`, `crates/idem`, `jobs.rs`).
fn named_item(span: &str) -> Option<String> {
    let span = span.strip_suffix("()").unwrap_or(span);
    let (path, bang) = span.strip_suffix('!').map_or((span, ""), |path| (path, "!"));
    let segments: Vec<&str> = path.split("::").collect();
    segments
        .iter()
        .all(|segment| is_identifier(segment))
        .then(|| format!("{}{bang}", segments[segments.len() - 1]))
}

/// The links to a Rust source file whose text is one code span naming an item
/// (`` [`settle`](../crates/domain/src/authentication.rs) ``), outside code blocks: the line, the
/// span, and the file as written (without its fragment).
fn symbol_links(text: &str) -> Vec<(usize, String, String)> {
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        let mut from = 0;
        while let Some(at) = line[from..].find("[`").map(|at| from + at) {
            from = at + 2;
            // A `[` inside a code span (after an odd number of backticks) opens no link.
            if line[..at].matches('`').count() % 2 == 1 {
                continue;
            }
            let after = &line[at + 2..];
            let Some(end) = after.find("`](") else { break };
            let (span, target) = (&after[..end], &after[end + 3..]);
            let Some(close) = target.find(')') else { break };
            let file = target[..close].split('#').next().expect("split yields a first piece");
            if !span.contains('`') && file.ends_with(".rs") && named_item(span).is_some() {
                found.push((number, span.to_owned(), file.to_owned()));
            }
            from = line.len() - target.len() + close;
        }
    }
    found
}

/// Whether Rust `source` defines `item` (as [`named_item`] gives it): a `fn`, `struct`, `enum`,
/// `trait`, `const`, `static`, `type` or `mod` of that name, a variant of one of its enums, or,
/// for `name!`, a `macro_rules! name`. Comments do not count; a re-export (`pub use`) does not
/// define.
fn defines(source: &str, item: &str) -> bool {
    const KINDS: [&str; 9] =
        ["fn", "struct", "enum", "trait", "const", "static", "type", "mod", "union"];
    let (name, is_macro) = item.strip_suffix('!').map_or((item, false), |name| (name, true));
    let braces = |code: &str| code.matches('{').count() as i64 - code.matches('}').count() as i64;
    // The depth of braces inside the enum being read, if one is: 1 on the lines of its variants.
    let mut in_enum: Option<i64> = None;
    for line in source.lines() {
        let code = line.split("//").next().expect("split yields a first piece");
        let words: Vec<&str> = code
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '!'))
            .filter(|word| !word.is_empty())
            .collect();
        for pair in words.windows(2) {
            let kind_matches =
                if is_macro { pair[0] == "macro_rules!" } else { KINDS.contains(&pair[0]) };
            if kind_matches && pair[1] == name {
                return true;
            }
        }
        if let Some(depth) = in_enum.as_mut() {
            let variant = code.trim_start().strip_prefix(name).map(str::trim_start);
            if *depth == 1
                && !is_macro
                && variant
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with([',', '(', '{', '=']))
            {
                return true;
            }
            *depth += braces(code);
            if *depth <= 0 {
                in_enum = None;
            }
        } else if words.windows(2).any(|pair| pair[0] == "enum" && is_identifier(pair[1]))
            && braces(code) > 0
        {
            in_enum = Some(braces(code));
        }
    }
    false
}

/// Whether `item` is the module that the source file `file` is (`idem::batch` is `batch.rs`,
/// `operations` is `operations/mod.rs`).
fn is_module_of(file: &str, item: &str) -> bool {
    let path = Path::new(file);
    let stem = path.file_stem().and_then(|stem| stem.to_str());
    let dir = path.parent().and_then(Path::file_name).and_then(|dir| dir.to_str());
    match stem {
        Some("mod" | "lib") => dir == Some(item),
        stem => stem == Some(item),
    }
}

/// The symbol links of the Markdown file at `path` (whose text is `text`) to a source file that
/// does not define the item they name, one line each. A link to no file is left to
/// `every_relative_link_of_the_readme_and_the_guide_resolves`.
fn wrong_symbol_links(path: &Path, text: &str) -> Vec<String> {
    let dir = path.parent().expect("a file's directory");
    symbol_links(text)
        .into_iter()
        .filter_map(|(line, span, file)| {
            let source = std::fs::read_to_string(dir.join(&file)).ok()?;
            let item = named_item(&span)?;
            (!defines(&source, &item) && !is_module_of(&file, &item))
                .then(|| format!("{}:{line}: [`{span}`]({file})", relative(path)))
        })
        .collect()
}

/// Where a text speaks of a work session or an issue by its number ("session 12", "Issue #40",
/// "issues #38"), which a reader of the repository cannot follow: the line and the words.
fn private_references(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        // ASCII lower case keeps every byte where it was, so offsets hold in `line` too.
        let lower = line.to_ascii_lowercase();
        for word in ["session", "issue"] {
            let mut from = 0;
            while let Some(at) = lower[from..].find(word) {
                let start = from + at;
                from = start + word.len();
                let starts_word =
                    !lower[..start].chars().next_back().is_some_and(|c| c.is_alphanumeric());
                let after = lower[from..].strip_prefix('s').unwrap_or(&lower[from..]);
                let spaced = after.trim_start_matches(' ');
                let number = match spaced.strip_prefix('#') {
                    Some(number) => number,
                    None if word == "session" && spaced.len() < after.len() => spaced,
                    None => continue,
                };
                let digits = number.chars().take_while(char::is_ascii_digit).count();
                if starts_word && digits > 0 {
                    let end = line.len() - number.len() + digits;
                    found.push((index + 1, line[start..end].to_owned()));
                }
            }
        }
    }
    found
}

#[test]
fn every_relative_link_of_the_readme_and_the_guide_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for path in markdown_files() {
        let text = std::fs::read_to_string(&path).expect("a Markdown file");
        let dir = path.parent().expect("a file's directory");
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if file.is_empty() { path.clone() } else { dir.join(file) };
            if !resolved.exists() {
                broken.push(format!("{}:{line}: {target} (no such file)", relative(&path)));
                continue;
            }
            if !fragment.is_empty() && resolved.extension().is_some_and(|e| e == "md") {
                let linked = std::fs::read_to_string(&resolved).expect("a linked Markdown file");
                if !anchors(&linked).iter().any(|a| a == fragment) {
                    broken.push(format!("{}:{line}: {target} (no such heading)", relative(&path)));
                }
            }
        }
    }
    assert!(checked >= 50, "found only {checked} relative links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_guide_names_files_and_items_of_the_code_by_links() {
    let mut unlinked = Vec::new();
    for path in markdown_files() {
        let text = std::fs::read_to_string(&path).expect("a Markdown file");
        for (line, named) in unlinked_paths(&text).into_iter().chain(unlinked_items(&text)) {
            unlinked.push(format!("{}:{line}: `{named}`", relative(&path)));
        }
    }
    assert!(
        unlinked.is_empty(),
        "files named without a link (write [`path`](relative/path)), or items named in a paragraph \
         that links to no source file (write [`Type::item`](relative/path/to/its/file.rs)):\n{}",
        unlinked.join("\n")
    );
}

#[test]
fn the_link_checks_find_what_they_look_for() {
    let text = "# A heading, with `code`\n[a](x.md#a-heading-with-code) `crates/idem` [`crates/idem`](c)\n```\n[b](y)\n```\n";
    assert_eq!(anchors(text), ["a-heading-with-code"]);
    assert_eq!(links(text), [(2, "x.md#a-heading-with-code".to_owned()), (2, "c".to_owned())]);
    assert_eq!(unlinked_paths(text), [(2, "crates/idem".to_owned())]);
    let text = "`Lease::phase` and `a::b c`\n\n[`Lease::phase`](e.rs) and `store::advance`\n";
    assert_eq!(unlinked_items(text), [(1, "Lease::phase".to_owned())]);
}

#[test]
fn links_that_name_an_item_point_at_the_file_that_defines_it() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for path in public_docs() {
        let text = std::fs::read_to_string(&path).expect("a Markdown file");
        checked += symbol_links(&text).len();
        wrong.extend(wrong_symbol_links(&path, &text));
    }
    assert!(checked >= 50, "found only {checked} links that name an item");
    assert!(
        wrong.is_empty(),
        "links that name an item the linked file does not define (a fn, struct, enum, variant, \
         trait, const, static, type, mod or macro_rules! of that name; for `A::B`, B):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_public_docs_never_speak_of_sessions_or_issues_by_number() {
    let mut found = Vec::new();
    for path in public_docs() {
        let text = std::fs::read_to_string(&path).expect("a Markdown file");
        for (line, words) in private_references(&text) {
            found.push(format!("{}:{line}: {words}", relative(&path)));
        }
    }
    assert!(
        found.is_empty(),
        "a reader cannot follow a session or an issue by its number; say what it changed:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_symbol_and_wording_checks_find_what_they_look_for() {
    let text = "[`settle`](a.rs#L3) [`Code::Gone`](a.rs) [`m!`](a.rs) [`x` or `y`](a.rs) \
                [`crates/idem`](a.rs) [`Code`](b.md) `[`s`](a.rs)`\n```\n[`f`](a.rs)\n```\n";
    let spans: Vec<String> = symbol_links(text).into_iter().map(|(_, span, _)| span).collect();
    assert_eq!(spans, ["settle", "Code::Gone", "m!"]);
    let source = "//! fn hidden\npub enum Code {\n    /// Gone, once\n    Gone,\n    Api { status: u16 },\n    \
                  Other(String),\n}\npub(crate) async fn settle<T>(x: T) {}\nmacro_rules! m { () => {} }\n\
                  pub use other::Elsewhere;\nfn after() { status(1); }\n";
    for item in ["Code", "Gone", "Api", "Other", "settle", "m!", "after"] {
        assert!(defines(source, item), "{item} is defined");
    }
    for item in ["hidden", "status", "Elsewhere", "once", "x", "settle!"] {
        assert!(!defines(source, item), "{item} is not defined");
    }
    let planted = root().join("docs/planted.md");
    let wrong = "[`Code::PaymentRequiresAction`](../crates/client/src/lib.rs)\n";
    assert_eq!(wrong_symbol_links(&planted, wrong).len(), 1, "a moved item's stale link is found");
    let right = "[`Code::PaymentRequiresAction`](../crates/client/src/error.rs)\n";
    assert!(wrong_symbol_links(&planted, right).is_empty());
    let module =
        "[`idem::batch`](../crates/idem/src/batch.rs) [`store`](../crates/idem/src/store/mod.rs)\n";
    assert!(wrong_symbol_links(&planted, module).is_empty(), "a module is the file it names");
    let text = "As issue #12 said,\nand in Session 4, after issues #38;\na session of 3 issue 5\n";
    let words: Vec<String> = private_references(text).into_iter().map(|(_, w)| w).collect();
    assert_eq!(words, ["issue #12", "Session 4", "issues #38"]);
}

#[test]
fn the_transcript_format_matches_what_it_promises() {
    let bound = HashMap::from([("PAY".to_owned(), "pay_1".to_owned())]);
    assert!(
        match_text("location: /v1/payments/$PAY", "location: /v1/payments/pay_1", &bound).is_some()
    );
    assert!(
        match_text("location: /v1/payments/$PAY", "location: /v1/payments/pay_2", &bound).is_none()
    );
    let binds = match_text("id $NEW, …", "id pay_9, and more", &HashMap::new()).unwrap();
    assert_eq!(binds["NEW"], "pay_9");
    let check = |want: &str, line: &str| {
        check_output(&[want.to_owned()], &[line.to_owned()], &bound).is_ok()
    };
    assert!(check(r#"{"id":"$PAY","amount":500,…}"#, r#"{"id":"pay_1","amount":500,"x":1}"#));
    assert!(!check(r#"{"id":"$PAY","amount":500}"#, r#"{"id":"pay_1","amount":500,"x":1}"#));
    assert!(!check(r#"{"id":"$PAY",…}"#, r#"{"id":"pay_2"}"#));
    assert!(check(
        r#"{"data":[{"id":"pay_…",…},…]}"#,
        r#"{"data":[{"id":"pay_3","a":1},{"b":2}]}"#
    ));
    assert!(!check(r#"{"data":[{"id":"pay_…",…}]}"#, r#"{"data":[{"id":"pay_3"},{"b":2}]}"#));
    assert!(check("HTTP/1.1 201 Created", "HTTP/1.1 201 Created"));
    assert!(!check("HTTP/1.1 201 Created", "HTTP/1.1 409 Conflict"));
    let ordered =
        check_output(&["b".to_owned(), "a".to_owned()], &["a".to_owned(), "b".to_owned()], &bound);
    assert!(ordered.is_err(), "expected lines are found in order");
    let md = "```console\n$ curl -s x\n```\n";
    assert!(transcripts("t.md", md).is_err(), "a curl without its output is refused");
    let md = "```sh\ncurl -s x\n```\n";
    assert!(transcripts("t.md", md).is_err(), "a curl outside a transcript is refused");
    for md in ["```sh\nX=1 cargo run -p c --example e\n```\n", "```bash\npsql -c 'SELECT 1'\n```\n"]
    {
        assert!(transcripts("t.md", md).is_err(), "an example outside a transcript is refused");
    }
    let md = "```sh\nmake test\npayments-api keys stuck\n```\n";
    assert!(transcripts("t.md", md).unwrap().is_empty(), "other commands may be listed");
    let text = "Run `PAYMENTS_KEY=k cargo run -p c --example e`, or `curl -s x`, with `curl`.\n";
    let spans: Vec<String> = inline_commands(text).into_iter().map(|(_, span)| span).collect();
    assert_eq!(spans, ["PAYMENTS_KEY=k cargo run -p c --example e", "curl -s x"]);
    let md = "```console\n$ server &\nlistening\n$ a && b\n$ c \\\n  &\n```\n";
    let steps = &transcripts("t.md", md).unwrap()[0].steps;
    let background: Vec<bool> = steps.iter().map(|step| step.background).collect();
    assert_eq!(background, [true, false, true]);
    assert_eq!(steps[0].expected, ["listening"]);
}

#[tokio::test]
async fn a_background_command_is_waited_for_and_killed_with_its_shell() {
    let mut shell = Shell::start(&[]);
    let none = HashMap::new();
    let server =
        shell.start_background("sleep 0.2; echo \"up as $BASHPID\"; exec sleep 300 &").await;
    let binds = server.unwrap().ready(&["up as $PID".to_owned()], &none).await.unwrap();
    let pid = binds["PID"].clone();
    let ended = shell.start_background("echo starting; exit 3 &").await.unwrap();
    let err = ended.ready(&["never printed".to_owned()], &none).await.unwrap_err();
    assert!(err.contains("exit status 3"), "{err}");
    // Running, and not a zombie that nobody has reaped yet (where /proc tells).
    let alive = || {
        let running =
            r#"kill -0 "$0" 2>/dev/null && ! grep -qs '^[0-9]* ([^)]*) Z' "/proc/$0/stat""#;
        std::process::Command::new("bash")
            .args(["-c", running, &pid])
            .status()
            .is_ok_and(|status| status.success())
    };
    assert!(alive(), "the background command runs on while its shell does");
    drop(shell);
    for _ in 0..100 {
        if !alive() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process {pid} outlived its shell");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn every_example_of_the_readme_and_the_guide_runs_as_written(pool: PgPool) {
    let mut all = Vec::new();
    for path in markdown_files() {
        let text = std::fs::read_to_string(&path).expect("a Markdown file");
        if let Some((line, span)) = inline_commands(&text).into_iter().next() {
            panic!(
                "{}:{line}: `{span}` is an example in a paragraph, which no test runs: show it in \
                 a ```console transcript with its expected output",
                relative(&path)
            );
        }
        match transcripts(&relative(&path), &text) {
            Ok(found) => {
                // A cross-check of the parser: every block opened as a transcript was read as one.
                let opened = text.lines().filter(|l| l.trim() == "```console").count();
                assert_eq!(found.len(), opened, "transcripts read in {}", relative(&path));
                all.extend(found);
            }
            Err(err) => panic!("{err}"),
        }
    }
    let commands: usize = all.iter().map(|t| t.steps.len()).sum();
    assert!(
        all.len() >= 10 && commands >= 30,
        "found only {} transcripts ({commands} commands)",
        all.len()
    );
    // Every example program of the client is run by a transcript, from what `make test` built.
    let examples =
        binary("payments-api").parent().expect("the binaries' directory").join("examples");
    for name in client_examples() {
        let run = format!("{EXAMPLE_AS_WRITTEN}{name}");
        assert!(
            all.iter().flat_map(|t| &t.steps).any(|step| step.command.contains(&run)),
            "no transcript runs `{run}`"
        );
        assert!(
            examples.join(&name).exists(),
            "{} is missing: run `cargo build --workspace --all-targets` first (make test does)",
            examples.join(&name).display()
        );
    }

    let sys = System::start(pool).await;
    // As `make run` serves it: the default processor timeouts, the inspector on, and the worker
    // beside the API (the completer, the reaper, webhook deliveries).
    let settings = [
        ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "10000"),
        ("PAYMENTS__PROCESSOR__MAX_RETRIES", "2"),
        ("PAYMENTS__PROCESSOR__BACKOFF_BASE_MS", "100"),
        ("PAYMENTS__PROCESSOR__BACKOFF_CAP_MS", "2000"),
        ("PAYMENTS__PROCESSOR__RETRY_AFTER_CAP_MS", "5000"),
        ("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true"),
        ("PAYMENTS__INSPECTOR__ENABLED", "true"),
        ("PAYMENTS__INSPECTOR__TOKEN", INSPECTOR_TOKEN),
    ];
    let api: Process = sys.api_with("", &settings).await;
    let _worker = sys.worker(&settings);
    let demo_api_port = free_port();
    let receiver_port = free_port();
    let database_server = &sys.db_url[..=sys.db_url.rfind('/').expect("a database URL's path")];
    let addresses = Addresses {
        database: sys.db_url.clone(),
        database_server: database_server.to_owned(),
        api: api.url.clone(),
        sim: sys.sim.url.clone(),
        demo_api: format!("127.0.0.1:{demo_api_port}"),
        receiver: format!("127.0.0.1:{receiver_port}"),
        examples: format!("{}/", examples.display()),
    };

    let mut by_file: Vec<(String, Vec<Transcript>)> = Vec::new();
    for transcript in all {
        match by_file.last_mut() {
            Some((file, list)) if *file == transcript.file => list.push(transcript),
            _ => by_file.push((transcript.file.clone(), vec![transcript])),
        }
    }
    for (file, transcripts) in by_file {
        let account = sys.account(&file).await;
        let mut shell = Shell::start(&[
            ("KEY", account.secret.clone()),
            ("DATABASE_URL", sys.db_url.clone()),
            ("PAYMENTS_DEMO_BIN", binary("payments-api").parent().unwrap().display().to_string()),
            ("PAYMENTS_DEMO_PORT", demo_api_port.to_string()),
            ("PAYMENTS_DEMO_SIM_PORT", free_port().to_string()),
            // The client's examples, pointed at the servers above instead of their defaults.
            ("PAYMENTS_API", api.url.clone()),
            ("SIM_URL", sys.sim.url.clone()),
            ("PORT", receiver_port.to_string()),
        ]);
        let mut bound: HashMap<String, String> = HashMap::new();
        for transcript in &transcripts {
            for step in &transcript.steps {
                let place = format!("{}:{}", transcript.file, step.line);
                let command = addresses.apply(&step.command);
                let expected: Vec<String> =
                    step.expected.iter().map(|l| addresses.apply(l)).collect();
                let checked = if step.background {
                    match shell.start_background(&command).await {
                        Ok(background) => background.ready(&expected, &bound).await,
                        Err(err) => Err(err),
                    }
                } else {
                    let (status, printed) = match shell.run(&command).await {
                        Ok(done) => done,
                        Err(err) => panic!("{place}: `{command}`: {err}\n{}", api.log()),
                    };
                    assert_eq!(
                        status,
                        0,
                        "{place}: `{command}` exited with {status}, printing:\n{}",
                        printed.join("\n")
                    );
                    check_output(&expected, &printed, &bound)
                };
                match checked {
                    Ok(binds) => {
                        for (name, value) in binds {
                            shell.export(&name, &value).await;
                            bound.insert(name, value);
                        }
                    }
                    Err(err) => panic!("{place}: `{command}`: {err}"),
                }
            }
        }
        // Whatever a file did to the stand-in, the next one starts with a healthy processor.
        sys.faults(serde_json::json!({})).await;
    }
}
