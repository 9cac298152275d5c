//! Secrets kept out of what rekindle records. Everything rekindle records
//! from outside its own code goes through a [`Redactor`] before it is
//! written: the command line `rekindle exec` runs (`child_start`, the
//! `start` event's placement, error messages), the program's stderr tail
//! (`child_exit`), and `[health] command` with its output
//! (`node_unhealthy`, the error). So `events.jsonl`, and every published
//! copy of it, never holds them. Pure text in, text out; the rules
//! (docs/run-directory.md#redaction), each replacing the secret by `***`:
//!
//! 1. URL credentials: `scheme://user:password@host` → `scheme://***@host`.
//! 2. An assignment to a secret name: `NAME=value`, `NAME: value`,
//!    `"NAME": "value"`, `NAME => value` (a quoted value keeps its quotes
//!    and ends at its closing quote, not at an escaped one; a Python
//!    prefix such as `b'…'` is kept; a bare value ends at white space, or
//!    at one of `,;&"'<>)]}` that is followed by white space, another of
//!    them, the end, or a next `name=` or `name: ` — so `password=abc;X` loses
//!    `abc;X` — and brackets it opens are closed first, so
//!    `token=Some("X")` loses `Some("X")`). `--api-key=VALUE` is one: a
//!    name may hold dashes and dots. The value of an HTTP authorization
//!    (`Authorization: Bearer TOKEN`) keeps its scheme. A secret name
//!    whose `:` ends its line (YAML: `password:`, or `password: |`) takes
//!    the next line (and the lines indented deeper than it) as its value:
//!    [`StreamRedactor`] carries that from one line to the next.
//! 3. An option with a secret name and its value in the next argument (or
//!    word): `--api-key VALUE` → `--api-key ***`, unless that next one
//!    starts with `--` (another option); an empty value (`""`) takes the
//!    word after it too.
//! 4. `Bearer TOKEN` anywhere → `Bearer ***`.
//!
//! A name is secret when one of its parts (split at `_`, `-` and `.`), in
//! lower case, ends with one of the secret words (`[telemetry]
//! secret_words`): `HF_TOKEN`, `apiKey`, `--api-key`, `DB_PASSWORD`,
//! `AWS_SECRET_ACCESS_KEY` are; `MAX_TOKENS`, `TOKENIZERS_PARALLELISM`,
//! `--keep`, `KeyError` are not (no part *ends* with a word). Redaction errs
//! towards hiding: `--text-key field` loses `field` too.
//!
//! Time is linear in the text: a program's stderr is redacted as it comes,
//! and one long line must not cost more than its bytes (each rule scans
//! forward once; where a rule looks ahead, the next look starts past it or
//! reuses what the last one found).

use std::ops::Range;

/// What a secret is replaced by.
pub const MASK: &str = "***";

/// Redacts secrets from command lines and log lines (module header).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// The secret words, lower case.
    words: Vec<String>,
}

/// Authorization schemes whose next word is the credential.
const AUTH_SCHEMES: [&str; 4] = ["bearer", "basic", "token", "digest"];

/// The state carried from one line of a stream to the next (rule 2's YAML
/// form): a secret key whose value is on the lines below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    /// The indentation of the key's line.
    indent: usize,
    /// No line of the value seen yet: the next non-blank line is the value
    /// whatever its indentation.
    first: bool,
    /// The key ended with a block scalar's indicator (`password: |`): its
    /// value is lines, however they are indented.
    block: bool,
}

/// Redacts a stream line by line, carrying what a line says about the next
/// (a YAML key whose value follows it). Made by [`Redactor::lines`].
#[derive(Debug, Clone)]
pub struct StreamRedactor<'a> {
    redactor: &'a Redactor,
    pending: Option<Pending>,
}

impl StreamRedactor<'_> {
    /// One line (without its line ending) with every secret replaced by
    /// [`MASK`], given the lines before it.
    pub fn line(&mut self, line: &str) -> String {
        let indent = line.bytes().take_while(|&b| is_blank(b)).count();
        if let Some(pending) = self.pending {
            if indent == line.len() {
                // A blank line: the value may still follow.
                return line.to_string();
            }
            if pending.first || indent > pending.indent {
                // The value's lines go on while they are deeper than the
                // key; a first line less deep than the key (a prefix before
                // the key, not YAML) sets the depth the rest keep.
                // A block scalar's first line as deep as its key (a prefix
                // before the key) sets the depth too.
                let deeper = match indent.cmp(&pending.indent) {
                    std::cmp::Ordering::Greater => Some(pending.indent),
                    std::cmp::Ordering::Less if pending.first && indent > 0 => Some(indent - 1),
                    std::cmp::Ordering::Equal if pending.first && pending.block && indent > 0 => Some(indent - 1),
                    _ => None,
                };
                self.pending = deeper.map(|indent| Pending { indent, first: false, block: pending.block });
                return format!("{}{MASK}", &line[..indent]);
            }
            self.pending = None;
        }
        if self.redactor.value_below(line) {
            let trimmed = line.trim_end().as_bytes();
            let block = trimmed.iter().rposition(|b| matches!(b, b'|' | b'>')).is_some_and(|bar| {
                is_block_indicator(&trimmed[bar..]) && trimmed[..bar].trim_ascii_end().ends_with(b":")
            });
            self.pending = Some(Pending { indent, first: true, block });
        }
        self.redactor.line(line)
    }
}

impl Redactor {
    /// A redactor whose secret names are those with a part ending in one of
    /// `words` (case-insensitive; empty words are ignored).
    pub fn new<S: AsRef<str>>(words: impl IntoIterator<Item = S>) -> Redactor {
        let words = words.into_iter().map(|w| w.as_ref().to_ascii_lowercase()).filter(|w| !w.is_empty()).collect();
        Redactor { words }
    }

    /// Whether `name` (an environment variable, an option with its dashes, a
    /// dotted key) names a secret.
    pub fn is_secret_name(&self, name: &str) -> bool {
        name.split(['_', '-', '.']).filter(|part| !part.is_empty()).any(|part| {
            self.words.iter().any(|w| {
                part.len() >= w.len()
                    && part.is_char_boundary(part.len() - w.len())
                    && part[part.len() - w.len()..].eq_ignore_ascii_case(w)
            })
        })
    }

    /// A line-by-line redactor for one stream (a program's stderr).
    pub fn lines(&self) -> StreamRedactor<'_> {
        StreamRedactor { redactor: self, pending: None }
    }

    /// `text` (one line, several, or one argument) with every secret
    /// replaced by [`MASK`]; its line endings (`\n`, `\r\n`, `\r`) are kept.
    pub fn text(&self, text: &str) -> String {
        if !text.contains(['\n', '\r']) {
            return self.line(text);
        }
        let mut lines = self.lines();
        let mut out = String::with_capacity(text.len());
        for piece in text.split_inclusive(['\n', '\r']) {
            let body = piece.trim_end_matches(['\n', '\r']);
            out.push_str(&lines.line(body));
            out.push_str(&piece[body.len()..]);
        }
        out
    }

    /// One line, alone.
    fn line(&self, text: &str) -> String {
        // Every rule looks at the text as given (one rule's mask must not
        // hide what another recognises a secret by); their spans are merged.
        let mut spans = url_credentials(text);
        spans.extend(bearer_tokens(text));
        spans.extend(self.assignments(text));
        spans.extend(self.option_values(text));
        mask(text, spans)
    }

    /// A command line, argument by argument: an argument after an option
    /// with a secret name is replaced whole (and the one after it too when
    /// it is empty), `NAME=VALUE` with a secret name keeps only `NAME=`, and
    /// every argument goes through [`Self::text`].
    pub fn args(&self, args: &[String]) -> Vec<String> {
        let mut out = Vec::with_capacity(args.len());
        let mut value_next = false;
        for arg in args {
            if std::mem::take(&mut value_next) && !arg.starts_with("--") {
                // `--token "" X`: an empty value hides nothing; X may be it.
                value_next = matches!(arg.as_str(), "" | "\"\"" | "''");
                out.push(MASK.to_string());
                continue;
            }
            if option_name(arg).is_some_and(|name| self.is_secret_name(name)) {
                value_next = true;
                out.push(arg.clone());
                continue;
            }
            match arg.split_once('=') {
                Some((name, value))
                    if !name.is_empty()
                        && !value.is_empty()
                        && name.bytes().all(is_name_byte)
                        && self.is_secret_name(name) =>
                {
                    out.push(format!("{name}={MASK}"));
                }
                _ => out.push(self.text(arg)),
            }
        }
        out
    }

    /// Rule 2: values assigned to a secret name.
    fn assignments(&self, text: &str) -> Vec<Range<usize>> {
        let bytes = text.as_bytes();
        let mut spans = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if matches!(bytes[i], b'=' | b':')
                && let Some((value, resume)) = self.assigned_value(text, i)
            {
                i = resume.max(i + 1);
                spans.push(value);
                continue;
            }
            i += 1;
        }
        spans
    }

    /// The secret name that ends at `end` (after an optional closing quote
    /// and blanks), if there is one.
    fn secret_name_before(&self, bytes: &[u8], end: usize) -> bool {
        let mut end = end;
        while end > 0 && is_blank(bytes[end - 1]) {
            end -= 1;
        }
        if end > 0 && matches!(bytes[end - 1], b'"' | b'\'') {
            end -= 1;
        }
        let mut start = end;
        while start > 0 && is_name_byte(bytes[start - 1]) {
            start -= 1;
        }
        // Name bytes are ASCII: the slice is on character boundaries.
        start < end && self.is_secret_name(std::str::from_utf8(&bytes[start..end]).unwrap_or_default())
    }

    /// The value assigned at the separator `sep` (`=`, `=>` or `:`) to a
    /// secret name, and where the scan for assignments goes on. A bare
    /// value was scanned once: the scan goes on past it. A quoted value may
    /// have been closed by a quote that opens a string inside a longer
    /// value (`token=' Cfg(api_key=S('X'))` takes ` Cfg(api_key=S(`), and
    /// an authorization's credential may be the next assignment's name
    /// (`token= token => "X"`): the scan goes on inside them. Each quote
    /// closes one quoted scan, so that stays linear.
    fn assigned_value(&self, text: &str, sep: usize) -> Option<(Range<usize>, usize)> {
        let bytes = text.as_bytes();
        let next = bytes.get(sep + 1).copied();
        // `==`, `::`, `:=` and the `://` of a URL assign nothing.
        if next == Some(bytes[sep]) || (bytes[sep] == b':' && matches!(next, Some(b'/' | b'='))) {
            return None;
        }
        // `token => "X"` (Ruby, Perl, PHP).
        let after = if bytes[sep] == b'=' && next == Some(b'>') { sep + 2 } else { sep + 1 };
        if !self.secret_name_before(bytes, sep) {
            return None;
        }
        let from = skip_blanks(bytes, after);
        if is_block_indicator(&bytes[from..]) {
            // YAML `key: |`: the value is on the lines below (`StreamRedactor`).
            return None;
        }
        let value = value_at(text, from)?;
        // `Authorization: Bearer TOKEN`: the credential is the next word.
        if AUTH_SCHEMES.iter().any(|s| text[value.clone()].eq_ignore_ascii_case(s)) {
            let cred = skip_blanks(bytes, value.end);
            if cred > value.end && cred < bytes.len() {
                // `None` when it is masked already. The scan goes on inside
                // a credential that opens no bracket (scanned twice at most);
                // past one that does (its inside is masked whole, and
                // resuming inside nested ones would rescan the rest of the
                // line once a level).
                return value_at(text, cred).map(|v| {
                    let resume =
                        if bytes[v.clone()].iter().any(|b| matches!(b, b'(' | b'[' | b'{')) { v.end } else { cred };
                    (v, resume)
                });
            }
        }
        let quoted = value.start > 0 && matches!(bytes[value.start - 1], b'"' | b'\'');
        let resume = if quoted { value.start } else { value.end };
        Some((value, resume))
    }

    /// Whether `line` ends with a secret name and a `:` whose value is on
    /// the lines below (YAML `password:` or `password: |`).
    fn value_below(&self, line: &str) -> bool {
        let bytes = line.trim_end().as_bytes();
        let mut end = bytes.len();
        // A block scalar's indicator: `|`, `>`, `|-`, `>+2`…
        if let Some(bar) = bytes.iter().rposition(|b| matches!(b, b'|' | b'>'))
            && is_block_indicator(&bytes[bar..])
        {
            end = skip_blanks_back(bytes, bar);
        }
        end > 0 && bytes[end - 1] == b':' && self.secret_name_before(bytes, end - 1)
    }

    /// Rule 3: the word after an option with a secret name.
    fn option_values(&self, text: &str) -> Vec<Range<usize>> {
        let words = words(text);
        let mut spans = Vec::new();
        // A value word that starts inside a value already taken (a quoted
        // value may span words) is hidden already: not scanning it again
        // keeps this linear.
        let mut taken = 0;
        for k in 1..words.len() {
            if words[k].start < taken
                || !option_name(&text[words[k - 1].clone()]).is_some_and(|n| self.is_secret_name(n))
            {
                continue;
            }
            let value = &text[words[k].clone()];
            if value.trim_start_matches(['\'', '"']).starts_with("--") {
                continue;
            }
            let mut v = k;
            // `--access_token "" X`: an empty value hides nothing; X may be it.
            let empty = matches!(value.trim_end_matches([',', ')', ']']), "\"\"" | "''");
            if empty && v + 1 < words.len() && !text[words[v + 1].clone()].starts_with("--") {
                v += 1;
            }
            if let Some(span) = value_at(text, words[v].start) {
                taken = span.end;
                spans.push(span);
            }
        }
        spans
    }
}

/// The name of an option without a value (`--api-key`, `-token`): `None`
/// for anything else (`--x=1`, `-5`, `-`).
fn option_name(word: &str) -> Option<&str> {
    // An argument list as a program prints it (`['--token', 'X']`, a JSON
    // array, `(--token X)`): the quotes, brackets and comma around the word.
    let word = word.trim_start_matches(['(', '[', '{', '\'', '"']).trim_end_matches([',', '\'', '"', ')', ']', '}']);
    let name = word.strip_prefix("--").or_else(|| word.strip_prefix('-'))?;
    let first = name.bytes().next()?;
    (first.is_ascii_alphabetic() && name.bytes().all(is_name_byte)).then_some(name)
}

/// Bytes a name (`HF_TOKEN`, `--api-key`, `trainer.wandb.api_key`) is made of.
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t')
}

fn skip_blanks(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && is_blank(bytes[i]) {
        i += 1;
    }
    i
}

fn skip_blanks_back(bytes: &[u8], mut end: usize) -> usize {
    while end > 0 && is_blank(bytes[end - 1]) {
        end -= 1;
    }
    end
}

/// Whether `rest` (what follows a `:` and its blanks, to the end of the
/// line) is a YAML block scalar's indicator: `|`, `>`, `|-`, `>+2`…
fn is_block_indicator(rest: &[u8]) -> bool {
    if !matches!(rest.first(), Some(b'|' | b'>')) {
        return false;
    }
    // Scanned only as far as it looks like one: linear however often asked.
    let mut i = 1;
    while i < rest.len() && (rest[i].is_ascii_digit() || matches!(rest[i], b'-' | b'+')) {
        i += 1;
    }
    i = skip_blanks(rest, i);
    matches!(rest.get(i), None | Some(b'\n' | b'\r'))
}

/// Bytes that may end a bare value (when what follows does not continue it).
fn is_delimiter(b: u8) -> bool {
    b",;&\"'<>)]}".contains(&b)
}

/// The quoted string whose opening quote is at `open`: where its inside
/// ends (its closing quote, or the end of the line when there is none; a
/// backslash escapes the byte after it) and the index after it.
fn quoted_end(bytes: &[u8], open: usize) -> (usize, usize) {
    let quote = bytes[open];
    let mut i = open + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\n' | b'\r' => return (i, i),
            b if b == quote => return (i, i + 1),
            _ => i += 1,
        }
    }
    (bytes.len(), bytes.len())
}

/// The value starting at `from` (module header, rule 2): inside its quotes
/// when quoted (after a Python prefix such as `b` or `rb`), else a bare
/// value. `None` when empty or masked already.
fn value_at(text: &str, from: usize) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    let prefix = bytes.get(from..)?.iter().take(3).take_while(|b| b"bBrRuUfF".contains(b)).count();
    let span = match bytes.get(from + prefix) {
        Some(b'"' | b'\'') if prefix <= 2 => {
            let open = from + prefix;
            (open + 1)..quoted_end(bytes, open).0
        }
        _ => from..bare_value_end(bytes, from),
    };
    (!span.is_empty() && &text[span.clone()] != MASK).then_some(span)
}

/// Where the bare value starting at `from` ends (module header, rule 2).
fn bare_value_end(bytes: &[u8], from: usize) -> usize {
    let mut depth = 0usize;
    let mut i = from;
    while i < bytes.len() {
        let b = bytes[i];
        if depth > 0 {
            match b {
                b'\n' | b'\r' => return i,
                b'"' | b'\'' => {
                    i = quoted_end(bytes, i).1;
                    continue;
                }
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b.is_ascii_whitespace() {
            return i;
        }
        if matches!(b, b'(' | b'[' | b'{') {
            depth += 1;
            i += 1;
            continue;
        }
        if is_delimiter(b) {
            match bytes.get(i + 1) {
                None => return i,
                Some(&n) if n.is_ascii_whitespace() || is_delimiter(n) => return i,
                _ => {}
            }
            // `token=abc,lr=1`: the next assignment ends this value.
            let mut j = i + 1;
            while j < bytes.len() && is_name_byte(bytes[j]) {
                j += 1;
            }
            let assigns = match bytes.get(j) {
                Some(b'=') => true,
                Some(b':') => bytes.get(j + 1).is_none_or(|b| b.is_ascii_whitespace()),
                _ => false,
            };
            if j > i + 1 && assigns {
                return i;
            }
            // Name bytes hold no delimiter: go on after them.
            i = j.max(i + 1);
            continue;
        }
        i += 1;
    }
    bytes.len()
}

/// The white-space separated words of `text`, as byte ranges.
fn words(text: &str) -> Vec<Range<usize>> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                words.push(s..i);
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        words.push(s..text.len());
    }
    words
}

/// `text` with `spans` (on character boundaries, in any order, overlapping
/// ones merged) replaced by [`MASK`].
fn mask(text: &str, mut spans: Vec<Range<usize>>) -> String {
    spans.retain(|s| !s.is_empty());
    spans.sort_by_key(|s| s.start);
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut spans = spans.into_iter().peekable();
    while let Some(mut span) = spans.next() {
        while let Some(next) = spans.next_if(|next| next.start <= span.end) {
            span.end = span.end.max(next.end);
        }
        out.push_str(&text[copied..span.start]);
        out.push_str(MASK);
        copied = span.end;
    }
    out.push_str(&text[copied..]);
    out
}

/// The first index at or after `from` (up to `limit`) whose byte `stop`
/// accepts, reusing the last answer while it still holds: the rule that
/// calls it asks with `from` increasing, so each byte is scanned once.
struct Seek {
    from: usize,
    found: usize,
}

impl Seek {
    fn new() -> Seek {
        Seek { from: usize::MAX, found: 0 }
    }

    fn next(&mut self, bytes: &[u8], from: usize, stop: impl Fn(u8) -> bool) -> usize {
        if !(self.from <= from && from <= self.found) {
            self.from = from;
            self.found = bytes[from..].iter().position(|&b| stop(b)).map_or(bytes.len(), |k| from + k);
        }
        self.found
    }
}

/// Rule 1: `scheme://user:password@host` → `scheme://***@host`. A password
/// holding `/`, `?` or `#` (which a URL should have percent-encoded) ends
/// the authority early; it is still taken for one when the authority has a
/// `:` not followed by a port number and an `@` comes later in the word.
fn url_credentials(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let (mut word_end, mut next_at) = (Seek::new(), Seek::new());
    let mut search = 0;
    while let Some(found) = text[search..].find("://") {
        let start = search + found + 3;
        let word_end = word_end.next(bytes, start, |b| b.is_ascii_whitespace() || b"\"'<>\\`".contains(&b));
        let end = bytes[start..word_end].iter().position(|b| b"/?#".contains(b)).map_or(word_end, |k| start + k);
        let authority = &bytes[start..end];
        let userinfo = match authority.iter().rposition(|&b| b == b'@') {
            Some(at) => Some(at),
            None => authority
                .iter()
                .position(|&b| b == b':')
                .map(|colon| &authority[colon + 1..])
                .filter(|port| port.is_empty() || !port.iter().all(u8::is_ascii_digit))
                .map(|_| next_at.next(bytes, end, |b| b == b'@'))
                .filter(|&at| at < word_end)
                .map(|at| at - start),
        };
        if let Some(at) = userinfo
            && at > 0
            && &text[start..start + at] != MASK
        {
            spans.push(start..start + at);
        }
        search = end.max(start);
    }
    spans
}

/// Rule 4: the word after `Bearer`.
fn bearer_tokens(text: &str) -> Vec<Range<usize>> {
    let words = words(text);
    let mut spans = Vec::new();
    let mut taken = 0;
    for pair in words.windows(2) {
        if pair[1].start < taken {
            continue;
        }
        let scheme = text[pair[0].clone()].trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
        if scheme.eq_ignore_ascii_case("bearer")
            && let Some(span) = value_at(text, pair[1].start)
        {
            taken = span.end;
            spans.push(span);
        }
    }
    spans
}

/// The seeded inputs of the redaction fuzz tests (here and in
/// `exec/stderr.rs`, which feeds them through the stream in random chunks).
#[cfg(test)]
pub(crate) mod fuzz_inputs {
    /// Secrets, each placed where `X` is in one of [`SHAPES`] (wrapped in
    /// `SeCrEt…SeCrEt` so a survivor is found by that marker).
    pub const SECRETS: [&str; 7] = ["hunter2", "hf_AbC123xyz", "p@ss;w0rd", "sk-Te/st+=", "ß€cret", "a:b", "x"];

    /// The shapes programs print secrets in (issue #40's among them).
    pub const SHAPES: [&str; 22] = [
        "HF_TOKEN=X",
        "--api-key X",
        "\"password\": \"X\"",
        "https://user:X@example.com/x",
        "Authorization: Bearer X",
        "{\"password\": \"p\\\"X\"}",
        "{'hf_token': b'X'}",
        "token=Some(\"X\")",
        "password=abc;X",
        "token => \"X\"",
        "password:\n  X",
        "api_key: |\n    X\n    X",
        "--access_token \"\" X",
        "Config(api_key=SecretStr('X'), lr=1)",
        "curl -H 'Authorization: Basic X'",
        "GET /x?access_token=X&page=2",
        "Bearer X",
        "export HF_TOKEN=X",
        "git clone https://oauth2:X@gitlab.example.com/r.git",
        "argv: ['train.py', '--access_token', '', 'X', '--lr', '1']",
        "[\"--api-key\", \"X\"]",
        "(--access_token \"\" X)",
    ];

    /// `secret` as it is planted: marked on both sides.
    pub fn marked(secret: &str) -> String {
        format!("SeCrEt{secret}SeCrEt")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the default `[telemetry] secret_words`.
    fn redactor() -> Redactor {
        Redactor::new(&crate::config::TelemetrySection::default().secret_words)
    }

    fn text(line: &str) -> String {
        redactor().text(line)
    }

    fn args(args: &[&str]) -> Vec<String> {
        redactor().args(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn secret_names_are_those_with_a_part_ending_in_a_secret_word() {
        let r = redactor();
        for secret in [
            "HF_TOKEN",
            "hf_token",
            "GITHUB_TOKEN",
            "api_key",
            "apiKey",
            "--api-key",
            "OPENAI_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "PASSWD",
            "--password",
            "--secret",
            "--token",
            "authToken",
            "WANDB_API_KEY",
            "private_key",
            "HTTP_AUTH",
            "Authorization",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "SSHPASS",
            "trainer.wandb.api_key",
            "passphrase",
        ] {
            assert!(r.is_secret_name(secret), "{secret} is secret");
        }
        for plain in [
            "MAX_TOKENS",
            "max_tokens",
            "--max-tokens",
            "TOKENIZERS_PARALLELISM",
            "tokenizer",
            "--keep",
            "KeyError",
            "keys",
            "PWD",
            "PATH",
            "author",
            "--lr",
            "SLURM_JOB_ID",
            "",
            "--",
        ] {
            assert!(!r.is_secret_name(plain), "{plain} is not secret");
        }
    }

    #[test]
    fn the_secret_words_are_configurable_and_case_insensitive() {
        let r = Redactor::new(["WandB", ""]);
        assert!(r.is_secret_name("MY_WANDB") && r.is_secret_name("--wandb"));
        assert!(!r.is_secret_name("HF_TOKEN"), "only the words given");
        assert_eq!(r.text("HF_TOKEN=x wandb=y"), "HF_TOKEN=x wandb=***");
        // Without words, URL credentials and bearer tokens still go.
        let none = Redactor::new(Vec::<String>::new());
        assert_eq!(none.text("TOKEN=x https://u:p@h/ Bearer abc"), "TOKEN=x https://***@h/ Bearer ***");
    }

    #[test]
    fn url_credentials_are_redacted() {
        assert_eq!(text("https://user:hunter2@example.com/x"), "https://***@example.com/x");
        assert_eq!(
            text("clone https://ghp_abc@github.com/o/r.git failed"),
            "clone https://***@github.com/o/r.git failed"
        );
        assert_eq!(text("postgres://u:p%40ss@db:5432/x?sslmode=on"), "postgres://***@db:5432/x?sslmode=on");
        assert_eq!(text("a http://h/x b s3://k:s@bucket"), "a http://h/x b s3://***@bucket");
        assert_eq!(text("\"https://u:p@h\""), "\"https://***@h\"");
        assert_eq!(text("https://u:p@@h/x"), "https://***@h/x", "up to the last @ of the authority");
        assert_eq!(text("DATABASE_URL=mysql://root:pw@localhost/db"), "DATABASE_URL=mysql://***@localhost/db");
        assert_eq!(text("https://user:pa/ss?#@host/x y@z"), "https://***@host/x y@z", "an unencoded password");
        assert_eq!(text("https://host:8080/path@x"), "https://host:8080/path@x", "a port, then a path with @");
    }

    #[test]
    fn what_is_no_url_credential_stays() {
        for plain in [
            "https://example.com/a@b",
            "mailto:someone@example.com",
            "git@github.com:o/r.git",
            "https://@host/x",
            "://",
            "see user@host for details",
        ] {
            assert_eq!(text(plain), plain);
        }
        assert_eq!(text(&text("https://u:p@h/")), "https://***@h/", "idempotent");
    }

    #[test]
    fn environment_style_assignments_to_secret_names_are_redacted() {
        assert_eq!(text("HF_TOKEN=hf_TESTabc"), "HF_TOKEN=***");
        assert_eq!(text("export GITHUB_TOKEN=ghp_1 && run"), "export GITHUB_TOKEN=*** && run");
        assert_eq!(text("env AWS_SECRET_ACCESS_KEY=a/b+c python x.py"), "env AWS_SECRET_ACCESS_KEY=*** python x.py");
        assert_eq!(text("HF_TOKEN=\"a b\" next"), "HF_TOKEN=\"***\" next");
        assert_eq!(text("password = 'hunter2'"), "password = '***'");
        assert_eq!(text("token=abc,lr=1"), "token=***,lr=1");
        assert_eq!(text("GET /x?access_token=abc&page=2"), "GET /x?access_token=***&page=2");
        assert_eq!(text("db_password=\"unterminated"), "db_password=\"***");
        assert_eq!(text("TOKEN=a=b"), "TOKEN=***");
        assert_eq!(text("trainer.logger.api_key=k1 seed=3"), "trainer.logger.api_key=*** seed=3");
    }

    #[test]
    fn colon_and_json_style_assignments_to_secret_names_are_redacted() {
        assert_eq!(text("{'api_key': 'sk-1', 'lr': 0.1}"), "{'api_key': '***', 'lr': 0.1}");
        assert_eq!(text("{\"token\":\"t1\",\"secret\": \"s2\"}"), "{\"token\":\"***\",\"secret\": \"***\"}");
        assert_eq!(text("password: hunter2"), "password: ***");
        assert_eq!(text("Using token: hf_abc"), "Using token: ***");
    }

    #[test]
    fn an_authorization_keeps_its_scheme() {
        assert_eq!(text("Authorization: Bearer eyJhbGc.x.y"), "Authorization: Bearer ***");
        assert_eq!(text("-H 'Authorization: Basic dXNlcjpw'"), "-H 'Authorization: Basic ***'");
        assert_eq!(text("authorization: token ghp_x"), "authorization: token ***");
        assert_eq!(text("auth=Bearer"), "auth=***", "a lone scheme word is the value");
        assert_eq!(text("sending bearer abc.def"), "sending bearer ***");
        assert_eq!(text("Bearer"), "Bearer");
    }

    #[test]
    fn assignments_to_other_names_stay() {
        for plain in [
            "max_tokens=5",
            "MAX_TOKENS=5",
            "--keep=3",
            "TOKENIZERS_PARALLELISM=false",
            "KeyError: 'model.layers.0'",
            "RuntimeError: CUDA out of memory",
            "step=10 loss=2.5 lr=0.001",
            "if token == expected:",
            "auth::token::Kind",
            "token := 5",
            "TOKEN=",
            "token: ",
            "time 12:30:01",
            "https://host:8080/token",
            "see tokens: 512",
        ] {
            assert_eq!(text(plain), plain);
        }
    }

    #[test]
    fn option_values_in_the_next_word_are_redacted() {
        assert_eq!(text("train.py --api-key sk-1 --lr 3"), "train.py --api-key *** --lr 3");
        assert_eq!(text("--token  'a b' --x"), "--token  '***' --x");
        assert_eq!(text("-password hunter2"), "-password ***");
        assert_eq!(text("--no-auth --lr 3"), "--no-auth --lr 3", "a boolean option before another");
        assert_eq!(text("--token"), "--token");
        assert_eq!(text("--keep 3 --max-tokens 5 --tokenizer gpt2"), "--keep 3 --max-tokens 5 --tokenizer gpt2");
        // A quoted value spanning words that hold an option of their own.
        assert_eq!(text("--token 'a --secret b' c"), "--token '***' c");
    }

    /// Found by the redactor's fuzz test (issue #40): an option inside an
    /// argument list as programs print it (`sys.argv`, a JSON array, in
    /// brackets) kept its value.
    #[test]
    fn issue_40_an_option_in_a_printed_argument_list_hides_its_value() {
        assert_eq!(
            text("['train.py', '--access_token', 'X', '--lr', '1']"),
            "['train.py', '--access_token', '***', '--lr', '1']"
        );
        assert_eq!(text("['--token', '', 'X']"), "['--token', '', '***']");
        assert_eq!(text("[\"--api-key\", \"X\"]"), "[\"--api-key\", \"***\"]");
        assert_eq!(text("(--access_token \"\" X)"), "(--access_token \"\" ***)");
        assert_eq!(text("['--token', '--lr', '1']"), "['--token', '--lr', '1']", "an option is no value");
    }

    #[test]
    fn command_lines_are_redacted_argument_by_argument() {
        assert_eq!(
            args(&["prog", "--api-key=sk-TEST", "--secret", "s e c", "--password", "-dash", "--lr", "1"]),
            ["prog", "--api-key=***", "--secret", "***", "--password", "***", "--lr", "1"]
        );
        assert_eq!(args(&["p", "--token", "--lr", "1"]), ["p", "--token", "--lr", "1"]);
        assert_eq!(args(&["env", "HF_TOKEN=a,b c", "python"]), ["env", "HF_TOKEN=***", "python"]);
        assert_eq!(
            args(&["sh", "-c", "curl -H 'Authorization: Bearer x' https://u:p@h/", "--token"]),
            ["sh", "-c", "curl -H 'Authorization: Bearer ***' https://***@h/", "--token"]
        );
        assert_eq!(args(&["git", "clone", "https://t@github.com/o/r"]), ["git", "clone", "https://***@github.com/o/r"]);
        let plain = ["python3", "train.py", "--keep=3", "--max-tokens", "5", "--steps", "60", "max_tokens=5"];
        assert_eq!(args(&plain), plain);
        assert!(args(&[]).is_empty());
    }

    #[test]
    fn an_escaped_quote_does_not_end_a_quoted_value() {
        assert_eq!(text(r#"{"password": "p\"X"}"#), r#"{"password": "***"}"#);
        assert_eq!(text(r#"{'token': 'it\'s X', 'lr': 1}"#), r#"{'token': '***', 'lr': 1}"#);
        assert_eq!(text(r#"{"password": "a\\", "user": "u"}"#), r#"{"password": "***", "user": "u"}"#);
    }

    #[test]
    fn python_and_rust_reprs_are_redacted() {
        assert_eq!(text("{'hf_token': b'X', 'lr': 1}"), "{'hf_token': b'***', 'lr': 1}");
        assert_eq!(text("{'api_key': rb\"X\"}"), "{'api_key': rb\"***\"}");
        assert_eq!(text("token=Some(\"X\")"), "token=***");
        assert_eq!(text("Args { token: Some(\"X y\"), lr: 1 }"), "Args { token: ***, lr: 1 }");
        assert_eq!(text("Config(api_key=SecretStr('X'), lr=0.1)"), "Config(api_key=***, lr=0.1)");
        assert_eq!(text("bad_key: bad"), "bad_key: ***", "a bare word starting with b is no prefix");
    }

    #[test]
    fn an_assignment_inside_a_quoted_value_cut_short_is_found() {
        // Found by the fuzz test: `token='` took ` Config(api_key=SecretStr(`
        // as its value and the scan went on past it, so `X` survived.
        assert_eq!(text("token=' Config(api_key=SecretStr('X'), lr=1)"), "token='***, lr=1)");
        // Errs towards hiding: the inner `token="` opens a quote to the end.
        assert_eq!(text("password=\"a token=\" b"), "password=\"***\"***");
        // `token` is also an authorization scheme: its credential `=>` is
        // masked and the scan goes on to the assignment it begins.
        assert_eq!(text("token= token => \"X\""), "token= token ***> \"***\"");
    }

    #[test]
    fn a_bare_value_goes_on_past_a_delimiter_that_does_not_end_it() {
        assert_eq!(text("password=abc;X"), "password=***");
        assert_eq!(text("password=abc;X rest"), "password=*** rest");
        assert_eq!(text("password=a)b]c,d&e"), "password=***");
        assert_eq!(text("password=abc; user=x"), "password=***; user=x");
        assert_eq!(text("f(token=abc)"), "f(token=***)");
        assert_eq!(text("f(token=abc), g"), "f(token=***), g");
        assert_eq!(text("dict(token=abc,lr=1)"), "dict(token=***,lr=1)");
        assert_eq!(text("echo \"token=abc\""), "echo \"token=***\"");
    }

    #[test]
    fn an_arrow_assigns_too() {
        assert_eq!(text("{token => \"X\", lr => 1}"), "{token => \"***\", lr => 1}");
        assert_eq!(text(":api_key=>'X'"), ":api_key=>'***'");
        assert_eq!(text("lr => 3"), "lr => 3");
    }

    #[test]
    fn a_yaml_key_takes_its_value_from_the_lines_below() {
        assert_eq!(text("password:\n  X\nlr: 3\n"), "password:\n  ***\nlr: 3\n");
        assert_eq!(text("db:\n  password:\n\n    X\n  user: u"), "db:\n  password:\n\n    ***\n  user: u");
        assert_eq!(text("key: |\n  line 1\n  line 2\nnext: 1"), "key: |\n  ***\n  ***\nnext: 1");
        assert_eq!(text("token: >-\r\n  X\r\n"), "token: >-\r\n  ***\r\n");
        // A prompt and the answer typed below it.
        assert_eq!(text("Enter your token:\nX"), "Enter your token:\n***");
        // Line by line (a program's stderr) the same.
        let r = redactor();
        let mut lines = r.lines();
        assert_eq!(lines.line("hf_token:"), "hf_token:");
        assert_eq!(lines.line("  X"), "  ***");
        assert_eq!(lines.line("lr: 3"), "lr: 3");
        assert_eq!(lines.line("  not a value"), "  not a value");
        // A prefix deeper than the value (found by the stream fuzz test):
        // the value's first line sets how deep the rest are.
        assert_eq!(text("     api_key: |\n    X\n    X\nlr: 3"), "     api_key: |\n    ***\n    ***\nlr: 3");
        assert_eq!(text("    api_key: |\n    X\n    X\nlr: 3"), "    api_key: |\n    ***\n    ***\nlr: 3");
        // Not a block: a line as deep as the key is its sibling.
        assert_eq!(text("  password:\n  X\n  lr: 3"), "  password:\n  ***\n  lr: 3");
        for plain in ["config:\n  lr: 3", "tokens:\n  512", "token: x\n  y"] {
            assert_eq!(text(plain), plain.replace("token: x", "token: ***"));
        }
    }

    #[test]
    fn an_empty_option_value_hides_the_word_after_it() {
        assert_eq!(text("--access_token \"\" X --lr 1"), "--access_token \"\" *** --lr 1");
        assert_eq!(text("--token '' --lr 1"), "--token '' --lr 1");
        assert_eq!(
            args(&["p", "--access_token", "", "X", "--lr", "1"]),
            ["p", "--access_token", "***", "***", "--lr", "1"]
        );
    }

    #[test]
    fn redaction_is_linear_in_the_text() {
        // Inputs that made the rules rescan the rest of the line for each
        // match (240 KB of `://` took 8.3 s).
        let shapes: [&str; 9] = [
            "://",
            "a=",
            "token=(",
            "--token \"",
            "https://u:",
            "\"token\": \"\\",
            "k;",
            "Bearer (",
            // An authorization's credential opening a bracket, nested.
            "token= token (",
        ];
        let r = redactor();
        let cost = |piece: &str, bytes: usize, times: usize| {
            let line = piece.repeat(bytes / piece.len());
            (0..3)
                .map(|_| {
                    let started = std::time::Instant::now();
                    for _ in 0..times {
                        std::hint::black_box(r.text(&line));
                    }
                    started.elapsed()
                })
                .min()
                .unwrap()
        };
        for piece in shapes {
            // The same number of bytes: 64 lines of 16 KiB, one of 1 MiB.
            let small = cost(piece, 16 << 10, 64);
            let big = cost(piece, 1 << 20, 1);
            assert!(
                big < 8 * small.max(std::time::Duration::from_micros(50)),
                "{piece:?}: 1 MiB took {big:?}, 64 × 16 KiB {small:?}"
            );
        }
    }

    mod fuzz {
        use super::*;
        use crate::fuzz;
        use proptest::prelude::*;

        use crate::telemetry::redact::fuzz_inputs::{SECRETS, SHAPES};

        /// Text made of the pieces the rules look at, in any order.
        fn line() -> impl Strategy<Value = String> {
            const FIXED: [&str; 13] = ["=", ":", "://", "@", "/", "\"", "'", " ", "--", "token", "Bearer", "é", "***"];
            let piece = prop_oneof![proptest::sample::select(&FIXED[..]).prop_map(String::from), "[ -~]{0,4}"];
            proptest::collection::vec(piece, 0..24).prop_map(|p| p.concat())
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn any_text_is_redacted_without_panicking(text in line(), bytes in fuzz::bytes(256)) {
                let r = redactor();
                let _ = r.text(&text);
                let _ = r.text(&String::from_utf8_lossy(&bytes));
                let _ = r.args(&text.split(' ').map(String::from).collect::<Vec<_>>());
            }

            #[test]
            fn no_secret_from_the_list_survives_in_any_shape(
                before in line(),
                after in line(),
                secret in proptest::sample::select(&SECRETS[..]),
                form in 0usize..SHAPES.len(),
                stream in any::<bool>(),
            ) {
                let secret = crate::telemetry::redact::fuzz_inputs::marked(secret);
                let text = format!("{before} {} {after}", SHAPES[form].replace('X', &secret));
                let redacted = if stream {
                    let r = redactor();
                    let mut lines = r.lines();
                    text.split('\n').map(|l| lines.line(l)).collect::<Vec<_>>().join("\n")
                } else {
                    redactor().text(&text)
                };
                prop_assert!(!redacted.contains("SeCrEt"), "{text:?} -> {redacted:?}");
            }
        }
    }

    #[test]
    fn non_ascii_text_is_kept_and_cut_nowhere_inside_a_character() {
        assert_eq!(text("é token=ß€ ü"), "é token=*** ü");
        assert_eq!(text("naïve ünïcödé line"), "naïve ünïcödé line");
        assert_eq!(text("mot de passe: x"), "mot de passe: x", "`passe` does not end with `pass`");
    }
}
