//! Completion for `kubectl ferry <TAB>`: kubectl runs `kubectl_complete-ferry` (a link to
//! `kubectl-ferry`) with the words typed after `ferry`, the last one being completed, and reads
//! one candidate per line and a last `:<directive>` line (Cobra's protocol). This decides what
//! to offer from the words alone; the binary lists Transfer names when that is the answer.

/// Cobra's "do not fall back to file names" directive.
pub const NO_FILE_COMPLETION: u32 = 4;

/// What the word being completed can be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// These words (commands or flags), already filtered by the prefix.
    Words(Vec<String>),
    /// Names of Transfers in `namespace` (none: the kubeconfig's) starting with `prefix`.
    TransferNames {
        namespace: Option<String>,
        prefix: String,
    },
    Nothing,
}

/// Commands whose first argument is a Transfer's name.
const TAKES_A_NAME: &[&str] = &[
    "get", "watch", "describe", "logs", "trigger", "suspend", "resume", "delete",
];

/// Flags that take a value (the word after them is that value, not an argument).
fn takes_value(cmd: &clap::Command, flag: &str) -> bool {
    let all = cmd.get_arguments().chain(
        cmd.get_subcommands()
            .flat_map(|s| s.get_arguments().collect::<Vec<_>>()),
    );
    for arg in all {
        let long = arg.get_long().map(|l| format!("--{l}"));
        let short = arg.get_short().map(|s| format!("-{s}"));
        if long.as_deref() == Some(flag) || short.as_deref() == Some(flag) {
            return arg.get_action().takes_values();
        }
    }
    false
}

/// What to offer for the last of `words` (the words after `ferry`), given the plugin's
/// command line definition `cmd`.
pub fn offer(cmd: &clap::Command, words: &[String]) -> Offer {
    let Some((partial, before)) = words.split_last() else {
        return Offer::Nothing;
    };
    let mut namespace = None;
    let mut positional = Vec::new();
    let mut expecting_value: Option<&str> = None;
    for w in before {
        if let Some(flag) = expecting_value.take() {
            if flag == "-n" || flag == "--namespace" {
                namespace = Some(w.clone());
            }
            continue;
        }
        if let Some(v) = w.strip_prefix("--namespace=") {
            namespace = Some(v.to_owned());
        } else if w.starts_with('-') {
            if !w.contains('=') && takes_value(cmd, w) {
                expecting_value = Some(w.as_str());
            }
        } else {
            positional.push(w.as_str());
        }
    }
    if expecting_value.is_some() {
        // A flag's value: nothing this plugin can list.
        return Offer::Nothing;
    }
    let starts = |s: &str| s.starts_with(partial.as_str());
    match positional.first() {
        None if partial.starts_with('-') => Offer::Words(flags(cmd, partial)),
        None => Offer::Words(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_owned())
                .filter(|n| starts(n))
                .collect(),
        ),
        Some(sub) => {
            let Some(sub_cmd) = cmd.find_subcommand(sub) else {
                return Offer::Nothing;
            };
            if partial.starts_with('-') {
                return Offer::Words(flags(sub_cmd, partial));
            }
            if positional.len() == 1 && TAKES_A_NAME.contains(sub) {
                return Offer::TransferNames {
                    namespace,
                    prefix: partial.clone(),
                };
            }
            match (*sub, positional.len()) {
                ("completion", 1) => Offer::Words(
                    ["bash", "elvish", "fish", "powershell", "zsh"]
                        .into_iter()
                        .filter(|s| starts(s))
                        .map(str::to_owned)
                        .collect(),
                ),
                _ => Offer::Nothing,
            }
        }
    }
}

/// The long flags of `cmd` (its own and the global ones) starting with `partial`.
fn flags(cmd: &clap::Command, partial: &str) -> Vec<String> {
    let mut out: Vec<String> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .filter(|f| f.starts_with(partial))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Cobra's output: one candidate per line, then the directive.
pub fn render(candidates: &[String]) -> String {
    let mut s = String::new();
    for c in candidates {
        s.push_str(c);
        s.push('\n');
    }
    s.push_str(&format!(":{NO_FILE_COMPLETION}\n"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn cli() -> Command {
        Command::new("kubectl-ferry")
            .arg(
                Arg::new("namespace")
                    .short('n')
                    .long("namespace")
                    .global(true),
            )
            .subcommand(
                Command::new("get")
                    .arg(Arg::new("name"))
                    .arg(Arg::new("output").short('o').long("output")),
            )
            .subcommand(
                Command::new("watch")
                    .arg(Arg::new("name"))
                    .arg(Arg::new("timeout").long("timeout")),
            )
            .subcommand(Command::new("trigger").arg(Arg::new("name")))
            .subcommand(Command::new("completion").arg(Arg::new("shell")))
            .subcommand(
                Command::new("cp")
                    .arg(
                        Arg::new("no-wait")
                            .long("no-wait")
                            .action(ArgAction::SetTrue),
                    )
                    .arg(Arg::new("name").long("name")),
            )
            .subcommand(Command::new("hidden").hide(true))
    }

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_first_word_completes_to_the_commands() {
        let cmd = cli();
        assert_eq!(
            offer(&cmd, &words(&[""])),
            Offer::Words(words(&["get", "watch", "trigger", "completion", "cp"]))
        );
        assert_eq!(
            offer(&cmd, &words(&["c"])),
            Offer::Words(words(&["completion", "cp"]))
        );
        assert_eq!(
            offer(&cmd, &words(&["--na"])),
            Offer::Words(words(&["--namespace"]))
        );
    }

    #[test]
    fn a_name_argument_completes_to_the_transfers_of_the_namespace_given() {
        let cmd = cli();
        assert_eq!(
            offer(&cmd, &words(&["watch", "co"])),
            Offer::TransferNames {
                namespace: None,
                prefix: "co".into()
            }
        );
        assert_eq!(
            offer(&cmd, &words(&["-n", "ml", "trigger", ""])),
            Offer::TransferNames {
                namespace: Some("ml".into()),
                prefix: String::new()
            }
        );
        assert_eq!(
            offer(
                &cmd,
                &words(&["watch", "--timeout", "5m", "--namespace=gpu", "x"])
            ),
            Offer::TransferNames {
                namespace: Some("gpu".into()),
                prefix: "x".into()
            }
        );
        // After the name, and for a flag's value, nothing.
        assert_eq!(offer(&cmd, &words(&["watch", "copy", ""])), Offer::Nothing);
        assert_eq!(
            offer(&cmd, &words(&["watch", "--timeout", ""])),
            Offer::Nothing
        );
        assert_eq!(offer(&cmd, &words(&["-n", ""])), Offer::Nothing);
    }

    #[test]
    fn flags_and_fixed_values_complete_by_prefix() {
        let cmd = cli();
        assert_eq!(
            offer(&cmd, &words(&["cp", "--n"])),
            Offer::Words(words(&["--name", "--no-wait"]))
        );
        assert_eq!(
            offer(&cmd, &words(&["completion", "z"])),
            Offer::Words(words(&["zsh"]))
        );
        assert_eq!(offer(&cmd, &words(&["nope", ""])), Offer::Nothing);
        assert_eq!(render(&words(&["a", "b"])), "a\nb\n:4\n");
        assert_eq!(render(&[]), ":4\n");
    }
}
