//! `--exclude` / `--include` rules with rsync's matching semantics, over path bytes.
//!
//! - Rules are tried in the order given; the first that matches decides; no match includes.
//! - A pattern ending in `/` matches directories only.
//! - A pattern starting with `/` is anchored at the root of the transfer; one with a `/`
//!   elsewhere (or `**`) matches the whole relative path or any tail of it that starts after a
//!   `/`; any other pattern matches the entry's own name at every depth.
//! - `*` matches any bytes but `/`, `**` any bytes including `/`, `?` one byte but `/`,
//!   `[a-z]` / `[!a-z]` one byte of (not of) a class, `\x` the byte `x` itself.
//! - An excluded directory is not walked, so nothing beneath it can be included again.
//!
//! The same rules travel to a receiver (as text) so that `--delete` keeps destination entries an
//! exclude rule matches, as rsync does: a receiver compiles them with this module too, and a
//! hostile sender can only make it delete less.
//!
//! Cost: one rule costs at most (pattern tokens + 1) x (path bytes + 1) steps of a dynamic
//! programme, tails included (one pass, not one per `/`), so no pattern backtracks. Rules from a
//! peer also share a budget of [`MAX_PEER_MATCH_WORK`] steps per session: once it is spent every
//! further entry counts as excluded (kept from `--delete`), which can only make it delete less.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most rules accepted (from the command line or from a peer).
pub const MAX_RULES: usize = 1024;
/// Longest pattern accepted, in bytes.
pub const MAX_PATTERN: usize = 4096;
/// Most bytes the rules may take in a Hello (`filter_rules`, with their `+ `/`- ` and protobuf
/// framing): the Hello is a control frame of at most 64 KiB
/// (`MAX_CONTROL_PAYLOAD`), and the rest of it needs well under 4 KiB. So
/// 1 024 rules of 4 KiB each work for `copy`, not for `send`: a sender checks this before it
/// connects ([`Filter::check_wire_size`]).
pub const MAX_WIRE_RULES_BYTES: usize = 60 * 1024;
/// Matching steps the rules a peer sent may cost a receiver in one session (about a second of
/// CPU); beyond it entries count as excluded.
pub const MAX_PEER_MATCH_WORK: u64 = 1 << 30;

/// An invalid rule.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("empty {0} pattern")]
    Empty(&'static str),
    #[error("{which} pattern {pattern:?} is longer than {MAX_PATTERN} bytes")]
    TooLong {
        which: &'static str,
        pattern: String,
    },
    #[error("{which} pattern {pattern:?}: unclosed `[`")]
    UnclosedClass {
        which: &'static str,
        pattern: String,
    },
    #[error("more than {MAX_RULES} --exclude/--include rules")]
    TooMany,
    #[error("filter rule {0:?} is neither `+ PATTERN` nor `- PATTERN`")]
    BadWireRule(String),
    #[error(
        "the --exclude/--include rules take {bytes} bytes to send, more than the {limit} a \
         receiver accepts (send them as fewer or shorter patterns, e.g. with ** or classes)"
    )]
    WireTooLarge { bytes: usize, limit: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Byte(u8),
    AnyByte,
    Star,
    DoubleStar,
    Class {
        negated: bool,
        ranges: Vec<(u8, u8)>,
    },
}

impl Token {
    fn matches(&self, b: u8) -> bool {
        match self {
            Token::Byte(x) => *x == b,
            Token::AnyByte => b != b'/',
            Token::Class { negated, ranges } => {
                b != b'/' && ranges.iter().any(|&(lo, hi)| lo <= b && b <= hi) != *negated
            }
            Token::Star | Token::DoubleStar => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Matched against the entry's own name.
    Name,
    /// Matched against the whole relative path.
    Anchored,
    /// Matched against the whole relative path or a tail of it starting after a `/`.
    Tail,
}

#[derive(Debug, Clone)]
struct Rule {
    include: bool,
    text: String,
    dir_only: bool,
    scope: Scope,
    tokens: Vec<Token>,
}

/// An ordered list of include and exclude rules.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    rules: Vec<Rule>,
    /// Steps spent matching so far, and the cap (rules from a peer only).
    work: Arc<Work>,
}

#[derive(Debug, Default)]
struct Work {
    spent: AtomicU64,
    budget: Option<u64>,
    warned: AtomicBool,
}

impl Filter {
    /// Compiles rules given as (include?, pattern), in command-line order.
    pub fn new<'a>(
        rules: impl IntoIterator<Item = (bool, &'a str)>,
    ) -> Result<Filter, FilterError> {
        let mut out = Vec::new();
        for (include, text) in rules {
            if out.len() == MAX_RULES {
                return Err(FilterError::TooMany);
            }
            out.push(Rule::compile(include, text)?);
        }
        Ok(Filter {
            rules: out,
            work: Arc::default(),
        })
    }

    /// The same rules under a budget of `steps` matching steps (shared by clones).
    pub fn with_budget(self, steps: u64) -> Filter {
        Filter {
            rules: self.rules,
            work: Arc::new(Work {
                budget: Some(steps),
                ..Work::default()
            }),
        }
    }

    /// Matching steps spent so far (deterministic: a test can bound the cost of a pattern).
    pub fn work(&self) -> u64 {
        self.work.spent.load(Ordering::Relaxed)
    }

    /// Compiles rules as [`Filter::to_wire`] writes them (`+ PATTERN` / `- PATTERN`), under the
    /// budget of [`MAX_PEER_MATCH_WORK`] steps.
    pub fn from_wire(rules: &[String]) -> Result<Filter, FilterError> {
        if rules.len() > MAX_RULES {
            return Err(FilterError::TooMany);
        }
        let parsed = rules
            .iter()
            .map(|r| match r.split_at_checked(2) {
                Some(("+ ", p)) => Ok((true, p)),
                Some(("- ", p)) => Ok((false, p)),
                _ => Err(FilterError::BadWireRule(r.clone())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Filter::new(parsed)?.with_budget(MAX_PEER_MATCH_WORK))
    }

    /// The rules as text for a peer, in order.
    pub fn to_wire(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| format!("{} {}", if r.include { '+' } else { '-' }, r.text))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Bytes the rules take in a Hello: each as `+ PATTERN` with its field tag and length.
    pub fn wire_size(&self) -> usize {
        self.rules.iter().map(|r| 2 + r.text.len() + 4).sum()
    }

    /// Refuses rules that would not fit in a Hello ([`MAX_WIRE_RULES_BYTES`]), so a sender says
    /// so before it connects instead of the receiver refusing an oversized frame.
    pub fn check_wire_size(&self) -> Result<(), FilterError> {
        let bytes = self.wire_size();
        if bytes > MAX_WIRE_RULES_BYTES {
            return Err(FilterError::WireTooLarge {
                bytes,
                limit: MAX_WIRE_RULES_BYTES,
            });
        }
        Ok(())
    }

    /// Whether the entry at `rel` (a relative path, `/`-separated, no leading `/`) is left out.
    /// Under a spent budget: always (see the module docs).
    pub fn excludes(&self, rel: &[u8], is_dir: bool) -> bool {
        let work = &self.work;
        let mut steps = 0u64;
        let mut decided = None;
        for r in &self.rules {
            if let Some(budget) = work.budget
                && work.spent.load(Ordering::Relaxed).saturating_add(steps) > budget
            {
                if !work.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the peer's filter rules used up their matching budget of {budget} steps; \
                         further entries are kept from --delete"
                    );
                }
                decided = Some(true);
                break;
            }
            if r.matches(rel, is_dir, &mut steps) {
                decided = Some(!r.include);
                break;
            }
        }
        work.spent.fetch_add(steps, Ordering::Relaxed);
        decided.unwrap_or(false)
    }
}

impl Rule {
    fn compile(include: bool, text: &str) -> Result<Rule, FilterError> {
        let which = if include { "--include" } else { "--exclude" };
        if text.len() > MAX_PATTERN {
            return Err(FilterError::TooLong {
                which,
                pattern: text.chars().take(64).collect(),
            });
        }
        let mut body = text.as_bytes();
        let dir_only = body.len() > 1 && body.ends_with(b"/");
        if dir_only {
            body = &body[..body.len() - 1];
        }
        let anchored = body.first() == Some(&b'/');
        if anchored {
            body = &body[1..];
        }
        if body.is_empty() {
            return Err(FilterError::Empty(which));
        }
        let tokens = tokenize(body).ok_or_else(|| FilterError::UnclosedClass {
            which,
            pattern: text.to_owned(),
        })?;
        let scope = if anchored {
            Scope::Anchored
        } else if body.contains(&b'/') || tokens.contains(&Token::DoubleStar) {
            Scope::Tail
        } else {
            Scope::Name
        };
        Ok(Rule {
            include,
            text: text.to_owned(),
            dir_only,
            scope,
            tokens,
        })
    }

    /// Adds the steps it took to `steps`.
    fn matches(&self, rel: &[u8], is_dir: bool, steps: &mut u64) -> bool {
        if self.dir_only && !is_dir {
            return false;
        }
        match self.scope {
            Scope::Anchored => glob_match(&self.tokens, rel, false, steps),
            Scope::Name => {
                let name = rel.rsplit(|&b| b == b'/').next().unwrap_or(rel);
                glob_match(&self.tokens, name, false, steps)
            }
            Scope::Tail => glob_match(&self.tokens, rel, true, steps),
        }
    }
}

/// None for an unclosed class.
fn tokenize(p: &[u8]) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'*' if p.get(i + 1) == Some(&b'*') => {
                while p.get(i) == Some(&b'*') {
                    i += 1;
                }
                out.push(Token::DoubleStar);
                continue;
            }
            b'*' => out.push(Token::Star),
            b'?' => out.push(Token::AnyByte),
            b'\\' if i + 1 < p.len() => {
                i += 1;
                out.push(Token::Byte(p[i]));
            }
            b'[' => {
                let (token, next) = class(p, i + 1)?;
                out.push(token);
                i = next;
                continue;
            }
            b => out.push(Token::Byte(b)),
        }
        i += 1;
    }
    Some(out)
}

/// Parses a class whose body starts at `i` (after `[`); returns it and the index after `]`.
fn class(p: &[u8], mut i: usize) -> Option<(Token, usize)> {
    let negated = matches!(p.get(i), Some(b'!' | b'^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let b = *p.get(i)?;
        if b == b']' && !first {
            return Some((Token::Class { negated, ranges }, i + 1));
        }
        first = false;
        if p.get(i + 1) == Some(&b'-') && p.get(i + 2).is_some_and(|&c| c != b']') {
            ranges.push((b, p[i + 2]));
            i += 3;
        } else {
            ranges.push((b, b));
            i += 1;
        }
    }
}

/// Whether `tokens` match all of `s` (with `tail`: or a tail of `s` that starts after a `/`): one
/// row of the usual dynamic programme per token, so the cost is at most (tokens + 1) times
/// (bytes + 1) whatever the pattern (no backtracking blow-up on `*a*a*a*b`, and tails cost no
/// more than the whole path). Adds the steps taken to `steps`.
fn glob_match(tokens: &[Token], s: &[u8], tail: bool, steps: &mut u64) -> bool {
    // row[j]: the tokens so far match s[k..j] for a start k (0, or with `tail` after a `/`).
    let mut row = vec![false; s.len() + 1];
    row[0] = true;
    if tail {
        for (j, &b) in s.iter().enumerate() {
            if b == b'/' {
                row[j + 1] = true;
            }
        }
    }
    *steps += s.len() as u64 + 1;
    let mut next = vec![false; s.len() + 1];
    for t in tokens {
        *steps += s.len() as u64 + 1;
        match t {
            Token::Star | Token::DoubleStar => {
                next[0] = row[0];
                for j in 1..=s.len() {
                    let extend = next[j - 1] && (*t == Token::DoubleStar || s[j - 1] != b'/');
                    next[j] = row[j] || extend;
                }
            }
            _ => {
                next[0] = false;
                for j in 1..=s.len() {
                    next[j] = row[j - 1] && t.matches(s[j - 1]);
                }
            }
        }
        std::mem::swap(&mut row, &mut next);
        if !row.contains(&true) {
            return false;
        }
    }
    row[s.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excl(rules: &[(bool, &str)], path: &str, dir: bool) -> bool {
        Filter::new(rules.iter().copied())
            .expect("rules")
            .excludes(path.as_bytes(), dir)
    }

    #[test]
    fn a_bare_pattern_matches_the_name_at_every_depth() {
        let r = [(false, "*.tmp")];
        assert!(excl(&r, "a.tmp", false));
        assert!(excl(&r, "x/y/a.tmp", false));
        assert!(!excl(&r, "a.tmp.keep", false));
        assert!(!excl(&r, "a.tmp/b", false), "the name of b is b");
    }

    #[test]
    fn a_leading_slash_anchors_at_the_root() {
        let r = [(false, "/cache")];
        assert!(excl(&r, "cache", true));
        assert!(!excl(&r, "x/cache", true));
    }

    #[test]
    fn a_slash_inside_matches_a_tail_of_the_path_at_a_component_boundary() {
        let r = [(false, "logs/*.gz")];
        assert!(excl(&r, "logs/a.gz", false));
        assert!(excl(&r, "srv/logs/a.gz", false));
        assert!(!excl(&r, "srvlogs/a.gz", false));
        assert!(!excl(&r, "logs/x/a.gz", false), "* stops at /");
        assert!(excl(&[(false, "logs/**.gz")], "logs/x/a.gz", false));
    }

    #[test]
    fn a_trailing_slash_matches_directories_only() {
        let r = [(false, "build/")];
        assert!(excl(&r, "build", true));
        assert!(!excl(&r, "build", false));
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let r = [(true, "*.txt"), (true, "*/"), (false, "*")];
        assert!(!excl(&r, "a.txt", false));
        assert!(!excl(&r, "d", true));
        assert!(!excl(&r, "d/b.txt", false));
        assert!(excl(&r, "d/b.bin", false));
        assert!(!excl(&[(false, "*.txt"), (true, "a.txt")], "b.bin", false));
        assert!(excl(&[(false, "*.txt"), (true, "a.txt")], "a.txt", false));
    }

    #[test]
    fn classes_question_marks_and_escapes() {
        assert!(excl(&[(false, "f[0-9].bin")], "f7.bin", false));
        assert!(!excl(&[(false, "f[!0-9].bin")], "f7.bin", false));
        assert!(excl(&[(false, "f[!0-9].bin")], "fx.bin", false));
        assert!(excl(&[(false, "a?c")], "abc", false));
        assert!(!excl(&[(false, "a?c")], "a/c", false));
        assert!(excl(&[(false, r"a\*c")], "a*c", false));
        assert!(!excl(&[(false, r"a\*c")], "abc", false));
        assert!(excl(&[(false, "[]]x")], "]x", false));
    }

    #[test]
    fn names_that_are_not_utf8_are_matched_as_bytes() {
        let f = Filter::new([(false, "caf*")]).expect("rules");
        assert!(f.excludes(b"d/caf\xe9", false));
    }

    /// The adversarial rerun: nested `**/` rules against an entry 1 000 levels deep cost one
    /// pass per rule, not one per tail, and the peer's budget caps the rest.
    #[test]
    fn nested_double_stars_cost_one_pass_per_rule() {
        let rule = "- ".to_owned() + &"**/".repeat(MAX_PATTERN / 3 - 1) + "x";
        let rules = vec![rule; 15];
        let f = Filter::from_wire(&rules).expect("rules");
        let deep = "d/".repeat(1000) + "y";
        assert!(!f.excludes(deep.as_bytes(), false));
        let tokens = 2 * (MAX_PATTERN / 3 - 1) + 1;
        let bound = 15 * (tokens as u64 + 1) * (deep.len() as u64 + 1);
        assert!(f.work() <= bound, "{} steps > {bound}", f.work());
        // Before: one pass per tail (1 000 of them), about 1 000 times this.
        assert!(f.work() < 100_000_000, "{}", f.work());
        // Tails still match at component boundaries only.
        let g = Filter::new([(false, "**/c/x")]).expect("rules");
        assert!(g.excludes(b"a/b/c/x", false));
        assert!(!g.excludes(b"a/bc/x", false));
        assert!(
            Filter::new([(false, "b/c")])
                .expect("rules")
                .excludes(b"a/b/c", false)
        );
        assert!(
            !Filter::new([(false, "b/c")])
                .expect("rules")
                .excludes(b"ab/c", false)
        );
    }

    #[test]
    fn a_spent_budget_keeps_every_further_entry() {
        let f = Filter::new([(false, "*.tmp")])
            .expect("rules")
            .with_budget(100);
        assert!(!f.excludes(b"a.txt", false));
        let long = "x".repeat(200);
        // This one passes the budget; it and every entry after it count as excluded.
        let _ = f.excludes(long.as_bytes(), false);
        assert!(f.work() > 100);
        assert!(f.excludes(b"a.txt", false), "kept once the budget is spent");
        // Without a budget (the user's own rules) nothing changes.
        let g = Filter::new([(false, "*.tmp")]).expect("rules");
        let _ = g.excludes(long.as_bytes(), false);
        assert!(!g.excludes(b"a.txt", false));
    }

    #[test]
    fn pathological_patterns_stay_cheap() {
        let p = "*a".repeat(200) + "b";
        let s = "a".repeat(4000);
        let f = Filter::new([(false, p.as_str())]).expect("rules");
        let t = std::time::Instant::now();
        assert!(!f.excludes(s.as_bytes(), false));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn bad_rules_are_refused_with_the_flag_named() {
        let e = Filter::new([(false, "")]).expect_err("empty");
        assert_eq!(e.to_string(), "empty --exclude pattern");
        let e = Filter::new([(true, "a[b")]).expect_err("class");
        assert!(e.to_string().contains("--include pattern \"a[b\""), "{e}");
        assert!(Filter::from_wire(&["* x".into()]).is_err());
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("- {i}")).collect();
        assert!(Filter::from_wire(&many).is_err());
    }

    #[test]
    fn rules_that_fit_the_hello_and_rules_that_do_not() {
        let long = "x".repeat(MAX_PATTERN);
        let many = Filter::new((0..MAX_RULES).map(|_| (false, long.as_str()))).expect("rules");
        let e = many.check_wire_size().expect_err("4 MiB of rules");
        assert!(e.to_string().contains("more than the 61440"), "{e}");
        let fits: Vec<(bool, &str)> = (0..14).map(|_| (false, long.as_str())).collect();
        let f = Filter::new(fits).expect("rules");
        f.check_wire_size().expect("56 KiB fits");
    }

    #[test]
    fn rules_survive_the_wire() {
        let f = Filter::new([(true, "keep/"), (false, "/a b/**")]).expect("rules");
        let wire = f.to_wire();
        assert_eq!(wire, vec!["+ keep/".to_owned(), "- /a b/**".to_owned()]);
        let g = Filter::from_wire(&wire).expect("back");
        assert!(g.excludes(b"a b/c/d", false));
        assert!(!g.excludes(b"keep", true));
    }
}
