//! Secrets kept out of what rekindle records. The command line `rekindle
//! exec` runs (`child_start`, the `start` event's placement, error messages)
//! and the program's stderr tail (`child_exit`) go through a [`Redactor`]
//! before they are written, so `events.jsonl`, and every published copy of
//! it, never holds them. Pure text in, text out; the rules
//! (docs/run-directory.md#redaction), each replacing the secret by `***`:
//!
//! 1. URL credentials: `scheme://user:password@host` → `scheme://***@host`.
//! 2. An assignment to a secret name: `NAME=value`, `NAME: value`,
//!    `"NAME": "value"` (a quoted value keeps its quotes; a bare one ends at
//!    white space or one of `,;&"'<>)]}`). `--api-key=VALUE` is one: a name
//!    may hold dashes and dots. The value of an HTTP authorization
//!    (`Authorization: Bearer TOKEN`) keeps its scheme.
//! 3. An option with a secret name and its value in the next argument (or
//!    word): `--api-key VALUE` → `--api-key ***`, unless that next one
//!    starts with `--` (another option).
//! 4. `Bearer TOKEN` anywhere → `Bearer ***`.
//!
//! A name is secret when one of its parts (split at `_`, `-` and `.`), in
//! lower case, ends with one of the secret words (`[telemetry]
//! secret_words`): `HF_TOKEN`, `apiKey`, `--api-key`, `DB_PASSWORD`,
//! `AWS_SECRET_ACCESS_KEY` are; `MAX_TOKENS`, `TOKENIZERS_PARALLELISM`,
//! `--keep`, `KeyError` are not (no part *ends* with a word). Redaction errs
//! towards hiding: `--text-key field` loses `field` too.

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
        name.split(['_', '-', '.'])
            .filter(|part| !part.is_empty())
            .map(str::to_ascii_lowercase)
            .any(|part| self.words.iter().any(|w| part.ends_with(w.as_str())))
    }

    /// `text` (one line, or one argument) with every secret replaced by [`MASK`].
    pub fn text(&self, text: &str) -> String {
        // Every rule looks at the text as given (one rule's mask must not
        // hide what another recognises a secret by); their spans are merged.
        let mut spans = url_credentials(text);
        spans.extend(bearer_tokens(text));
        spans.extend(self.assignments(text));
        spans.extend(self.option_values(text));
        mask(text, spans)
    }

    /// A command line, argument by argument: an argument after an option
    /// with a secret name is replaced whole, `NAME=VALUE` with a secret
    /// name keeps only `NAME=`, and every argument goes through [`Self::text`].
    pub fn args(&self, args: &[String]) -> Vec<String> {
        let mut out = Vec::with_capacity(args.len());
        let mut value_next = false;
        for arg in args {
            if std::mem::take(&mut value_next) && !arg.starts_with("--") {
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
                && let Some(value) = self.assigned_value(text, i)
            {
                i = value.end;
                spans.push(value);
                continue;
            }
            i += 1;
        }
        spans
    }

    /// The value assigned at the separator `sep` (`=` or `:`) to a secret name.
    fn assigned_value(&self, text: &str, sep: usize) -> Option<Range<usize>> {
        let bytes = text.as_bytes();
        let next = bytes.get(sep + 1).copied();
        // `==`, `::`, `:=` and the `://` of a URL assign nothing.
        if next == Some(bytes[sep]) || (bytes[sep] == b':' && matches!(next, Some(b'/' | b'='))) {
            return None;
        }
        let mut end = sep;
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
        if start == end || !self.is_secret_name(&text[start..end]) {
            return None;
        }
        let mut from = sep + 1;
        while from < bytes.len() && is_blank(bytes[from]) {
            from += 1;
        }
        let value = value_at(text, from)?;
        // `Authorization: Bearer TOKEN`: the credential is the next word.
        if AUTH_SCHEMES.iter().any(|s| text[value.clone()].eq_ignore_ascii_case(s)) {
            let mut cred = value.end;
            while cred < bytes.len() && is_blank(bytes[cred]) {
                cred += 1;
            }
            if cred > value.end && cred < bytes.len() {
                // `None` when it is masked already.
                return value_at(text, cred);
            }
        }
        Some(value)
    }

    /// Rule 3: the word after an option with a secret name.
    fn option_values(&self, text: &str) -> Vec<Range<usize>> {
        let words = words(text);
        let mut spans = Vec::new();
        for pair in words.windows(2) {
            let (option, value) = (&text[pair[0].clone()], &text[pair[1].clone()]);
            if option_name(option).is_some_and(|name| self.is_secret_name(name))
                && !value.starts_with("--")
                && let Some(span) = value_at(text, pair[1].start)
            {
                spans.push(span);
            }
        }
        spans
    }
}

/// The name of an option without a value (`--api-key`, `-token`): `None`
/// for anything else (`--x=1`, `-5`, `-`).
fn option_name(word: &str) -> Option<&str> {
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

/// Where a bare value ends.
fn ends_bare_value(b: u8) -> bool {
    b.is_ascii_whitespace() || b",;&\"'<>)]}".contains(&b)
}

/// The value starting at `from`: inside its quotes when quoted (to the
/// closing quote, or the end), else up to [`ends_bare_value`]. `None` when empty.
fn value_at(text: &str, from: usize) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    let span = match bytes.get(from)? {
        &quote @ (b'"' | b'\'') => {
            let inner = from + 1;
            let close = bytes[inner..].iter().position(|&b| b == quote).map_or(bytes.len(), |k| inner + k);
            inner..close
        }
        _ => from..bytes[from..].iter().position(|&b| ends_bare_value(b)).map_or(bytes.len(), |k| from + k),
    };
    (!span.is_empty() && &text[span.clone()] != MASK).then_some(span)
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

/// Rule 1: `scheme://user:password@host` → `scheme://***@host`. A password
/// holding `/`, `?` or `#` (which a URL should have percent-encoded) ends
/// the authority early; it is still taken for one when the authority has a
/// `:` not followed by a port number and an `@` comes later in the word.
fn url_credentials(text: &str) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut search = 0;
    while let Some(found) = text[search..].find("://") {
        let start = search + found + 3;
        let word_end =
            text[start..].find(|c: char| c.is_whitespace() || "\"'<>\\`".contains(c)).map_or(text.len(), |k| start + k);
        let end = text[start..word_end].find(['/', '?', '#']).map_or(word_end, |k| start + k);
        let authority = &text[start..end];
        let userinfo = match authority.rfind('@') {
            Some(at) => Some(at),
            None => authority
                .split_once(':')
                .filter(|(_, port)| port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|_| text[end..word_end].find('@').map(|k| end - start + k)),
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
    for pair in words.windows(2) {
        let scheme = text[pair[0].clone()].trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
        if scheme.eq_ignore_ascii_case("bearer")
            && let Some(span) = value_at(text, pair[1].start)
        {
            spans.push(span);
        }
    }
    spans
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

    mod fuzz {
        use super::*;
        use crate::fuzz;
        use proptest::prelude::*;

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
            fn a_secret_assigned_or_given_to_an_option_never_survives(
                before in line(),
                after in line(),
                secret in "[A-Za-z0-9+/_.-]{1,20}",
                form in 0usize..5,
            ) {
                let secret = format!("SeCrEt{secret}");
                let placed = match form {
                    0 => format!("HF_TOKEN={secret}"),
                    1 => format!("--api-key {secret}"),
                    2 => format!("\"password\": \"{secret}\""),
                    3 => format!("https://user:{secret}@example.com/x"),
                    _ => format!("Authorization: Bearer {secret}"),
                };
                let text = format!("{before} {placed} {after}");
                let redacted = redactor().text(&text);
                prop_assert!(!redacted.contains(&secret) || before.contains(&secret) || after.contains(&secret),
                    "{text:?} -> {redacted:?}");
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
