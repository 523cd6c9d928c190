//! `kubectl ferry`: the kubectl plugin for Transfers (docs/kubectl-ferry.md).
//!
//! Exit codes: 0 done (for `watch` and a followed `cp`: the Transfer Succeeded); 1 an error, a
//! missing Transfer, a Failed or deleted Transfer (`watch`, `cp`), logs the cluster could not
//! serve (`logs`); 2 `--timeout` passed while following, or the command line was invalid
//! (`cp` arguments that name no endpoint included).

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use ferry_api::names::MoverRole;
use kubectl_ferry::act::SpecVerb;
use kubectl_ferry::commands::{self, Scope, WatchEnd, error_chain, timeout_text};
use kubectl_ferry::cp;
use kubectl_ferry::format::parse_duration;

/// Show ferry Transfers (ferry.dev/v1alpha1) with their progress, follow one live, explain one,
/// and run, pause or delete one.
#[derive(Parser, Debug)]
#[command(name = "kubectl ferry", bin_name = "kubectl ferry", version)]
struct Cli {
    /// Namespace (default: the kubeconfig context's namespace, else "default").
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Transfers of every namespace (`get` only).
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// The kubeconfig context to use instead of the current one.
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of `cp`'s many options costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// List Transfers (or one) with phase, progress, files, throughput, ETA, attempts and age.
    Get {
        name: Option<String>,
        /// `wide` adds the mover nodes and the digest.
        #[arg(short = 'o', long = "output", value_enum)]
        output: Option<Output>,
    },
    /// Follow one Transfer as a live progress line until it finished (exit 0 Succeeded,
    /// 1 Failed, 2 timed out).
    Watch {
        name: String,
        /// Give up after this long ("90s", "5m", "1h30m"; a plain number is seconds).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Spec, status, conditions, mover pods (exit codes, termination messages) and Events.
    Describe { name: String },
    /// Each node's block store: blocks, bytes against the cap, hits, evictions (read from the
    /// node services' metrics through the API server's pod proxy).
    Nodes {
        /// The namespace ferry is installed in (where the node services run).
        #[arg(long, default_value = "ferry-system")]
        ferry_namespace: String,
    },
    /// Create a Transfer from SOURCE to DESTINATION and follow it with `watch`'s line
    /// (endpoints: NODE:/PATH, node/NODE:/PATH, pvc/CLAIM[:/PATH]; with --to-nodes or
    /// --selector, DESTINATION is the /PATH on each node).
    Cp {
        source: String,
        destination: String,
        /// A fan-out to these nodes (comma-separated).
        #[arg(long, value_name = "NODE,...")]
        to_nodes: Option<String>,
        /// A fan-out to the nodes with these labels (KEY=VALUE,...).
        #[arg(long, short = 'l', value_name = "KEY=VALUE,...")]
        selector: Option<String>,
        /// The Transfer's name (default: `cp-` and five random characters).
        #[arg(long)]
        name: Option<String>,
        /// `spec.bandwidthLimit` (bytes per second, a quantity: 100Mi).
        #[arg(long)]
        bandwidth_limit: Option<String>,
        /// `spec.streams`.
        #[arg(long)]
        streams: Option<u32>,
        /// Run again on this cron schedule (`spec.schedule.cron`: "0 2 * * *", @daily).
        #[arg(long, value_name = "CRON")]
        schedule: Option<String>,
        /// The schedule's IANA time zone (default UTC).
        #[arg(long, value_name = "ZONE")]
        time_zone: Option<String>,
        /// Create the destination claim if missing, this size (50Gi) or `fromSource`.
        #[arg(long, value_name = "SIZE|fromSource")]
        provision: Option<String>,
        /// The provisioned claim's StorageClass (default: the cluster's default).
        #[arg(long, value_name = "CLASS")]
        storage_class: Option<String>,
        /// A fan-out succeeds when this many nodes succeeded (`hostPath.minAvailable`).
        #[arg(long, value_name = "N")]
        min_available: Option<u32>,
        /// Print the name and return at once.
        #[arg(long)]
        no_wait: bool,
        /// Give up following after this long (exit 2; the Transfer goes on).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// `client`: print the Transfer instead of creating it (with -o yaml or json).
        #[arg(long, value_enum)]
        dry_run: Option<DryRun>,
        /// The dry run's format.
        #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
        output: CpFormat,
    },
    /// Run a Transfer again: a finished one at once, a running one when its run finishes
    /// (sets `spec.trigger`; the new run resumes from what the destination holds).
    Trigger { name: String },
    /// Stop a Transfer's movers (`spec.suspend: true`); `resume` continues where it stopped.
    Suspend { name: String },
    /// Let a suspended Transfer run again (`spec.suspend: false`).
    Resume { name: String },
    /// Delete a Transfer (the operator removes its pods, Secrets and staging first) and wait
    /// until it is gone.
    Delete {
        name: String,
        /// Return once the API server accepted the deletion.
        #[arg(long)]
        no_wait: bool,
        /// How long to wait for it to be gone.
        #[arg(long, value_parser = parse_duration, default_value = "2m")]
        timeout: Duration,
    },
    /// Print a completion script for SHELL (bash: `source <(kubectl ferry completion bash)`;
    /// kubectl completes plugins through an executable `kubectl_complete-ferry` on PATH, see
    /// docs/kubectl-ferry.md).
    Completion { shell: clap_complete::Shell },
    /// The movers' logs (of the newest attempt), through the pods/log API.
    Logs {
        name: String,
        /// Only this mover.
        #[arg(long, value_enum)]
        role: Option<Role>,
        /// Lines from the end of each log.
        #[arg(long)]
        tail: Option<i64>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Output {
    Wide,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum DryRun {
    Client,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum CpFormat {
    Yaml,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Role {
    Sender,
    Receiver,
}

impl From<Role> for MoverRole {
    fn from(r: Role) -> Self {
        match r {
            Role::Sender => MoverRole::Sender,
            Role::Receiver => MoverRole::Receiver,
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // kubectl completes `kubectl ferry ...` by running `kubectl_complete-ferry` (a link to this
    // binary) with the words typed; `kubectl-ferry __complete ...` does the same.
    let argv: Vec<String> = std::env::args().collect();
    let invoked = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if invoked == "kubectl_complete-ferry" {
        return complete(&argv[1..]).await;
    }
    if argv.get(1).map(String::as_str) == Some("__complete") {
        return complete(&argv[2..]).await;
    }
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            // Arguments that describe no Transfer are a command-line error, as clap's are.
            match e {
                kubectl_ferry::Error::Cp(_) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, kubectl_ferry::Error> {
    if cli.all_namespaces && !matches!(cli.command, Command::Get { .. }) {
        eprintln!("error: --all-namespaces works with `get` only; name the namespace with -n");
        return Ok(ExitCode::from(2));
    }
    if let Command::Completion { shell } = cli.command {
        // Rendered into memory first: the generators panic on a closed pipe (`| head`).
        let mut script = Vec::new();
        let mut cmd = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(shell, &mut cmd, "kubectl-ferry", &mut script);
        return match std::io::stdout().write_all(&script) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(kubectl_ferry::Error::Output(e))
            }
            _ => Ok(ExitCode::SUCCESS),
        };
    }
    // A client-side dry run reads no cluster: the namespace is -n, else the kubeconfig's.
    if let Command::Cp {
        dry_run: Some(DryRun::Client),
        output,
        ..
    } = &cli.command
    {
        let ns = cli
            .namespace
            .clone()
            .or_else(|| commands::kubeconfig_namespace(cli.context.as_deref()))
            .unwrap_or_else(|| "default".to_owned());
        let transfer = cp::transfer(&cp_args(&cli.command, ns)?)?;
        let text = match output {
            CpFormat::Yaml => serde_yaml::to_string(&transfer).unwrap_or_default(),
            CpFormat::Json => format!("{:#}\n", transfer),
        };
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let (client, default_ns) = commands::connect(cli.context.as_deref()).await?;
    let ns = cli.namespace.unwrap_or(default_ns);
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr();
    match cli.command {
        Command::Get { name, output } => {
            let scope = if cli.all_namespaces {
                Scope::AllNamespaces
            } else {
                Scope::Namespace(ns)
            };
            commands::get(
                &client,
                &scope,
                name.as_deref(),
                output.is_some(),
                &mut out,
                &mut err,
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Nodes { ferry_namespace } => {
            commands::nodes(&client, &ferry_namespace, &mut out).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Watch { name, timeout } => follow(&client, &ns, &name, timeout, &mut out).await,
        Command::Cp {
            no_wait, timeout, ..
        } => {
            let transfer = cp::transfer(&cp_args(&cli.command, ns.clone())?)?;
            let name = commands::cp(&client, &transfer, &mut out).await?;
            if no_wait {
                return Ok(ExitCode::SUCCESS);
            }
            let _ = out.flush();
            follow(&client, &ns, &name, timeout, &mut out).await
        }
        Command::Trigger { name } => act(&client, &ns, &name, SpecVerb::Trigger, &mut out).await,
        Command::Suspend { name } => act(&client, &ns, &name, SpecVerb::Suspend, &mut out).await,
        Command::Resume { name } => act(&client, &ns, &name, SpecVerb::Resume, &mut out).await,
        Command::Delete {
            name,
            no_wait,
            timeout,
        } => {
            let wait = (!no_wait).then_some(timeout);
            commands::delete(&client, &ns, &name, wait, &mut out).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completion { .. } => unreachable!("answered before connecting"),
        Command::Describe { name } => {
            commands::describe(&client, &ns, &name, &mut out, &mut err).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Logs { name, role, tail } => {
            let served = commands::logs(
                &client,
                &ns,
                &name,
                role.map(Into::into),
                tail,
                &mut out,
                &mut err,
            )
            .await?;
            Ok(if served {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

async fn act(
    client: &kube::Client,
    ns: &str,
    name: &str,
    verb: SpecVerb,
    out: &mut dyn std::io::Write,
) -> Result<ExitCode, kubectl_ferry::Error> {
    commands::act(client, ns, name, verb, out).await?;
    Ok(ExitCode::SUCCESS)
}

/// `watch`'s line until the Transfer finished (or `timeout`), mapped to the exit code.
async fn follow(
    client: &kube::Client,
    ns: &str,
    name: &str,
    timeout: Option<Duration>,
    out: &mut dyn std::io::Write,
) -> Result<ExitCode, kubectl_ferry::Error> {
    let tty = std::io::stdout().is_terminal();
    let end = commands::watch(client, ns, name, timeout, tty, out).await?;
    let _ = out.flush();
    Ok(match end {
        WatchEnd::Succeeded => ExitCode::SUCCESS,
        WatchEnd::Failed => ExitCode::from(1),
        WatchEnd::Deleted => {
            eprintln!("error: transfer {ns}/{name} was deleted");
            ExitCode::from(1)
        }
        WatchEnd::TimedOut(last) => {
            eprintln!(
                "error: timed out after {} waiting for transfer {ns}/{name} to finish{}",
                timeout.map(timeout_text).unwrap_or_default(),
                last.map(|l| format!(
                    " (last: {})",
                    l.split_whitespace().collect::<Vec<_>>().join(" ")
                ))
                .unwrap_or_default()
            );
            ExitCode::from(2)
        }
    })
}

/// `cp`'s arguments, for the namespace `namespace`.
fn cp_args(command: &Command, namespace: String) -> Result<cp::CpArgs, kubectl_ferry::Error> {
    let Command::Cp {
        source,
        destination,
        to_nodes,
        selector,
        name,
        bandwidth_limit,
        streams,
        schedule,
        time_zone,
        provision,
        storage_class,
        min_available,
        ..
    } = command
    else {
        unreachable!("cp_args of another command");
    };
    Ok(cp::CpArgs {
        source: source.clone(),
        destination: destination.clone(),
        nodes: cp::node_set(to_nodes.as_deref(), selector.as_deref())?,
        name: name.clone(),
        namespace,
        bandwidth_limit: bandwidth_limit.clone(),
        streams: *streams,
        schedule: schedule.clone(),
        time_zone: time_zone.clone(),
        provision: provision.clone(),
        storage_class: storage_class.clone(),
        min_available: *min_available,
    })
}

/// Prints the candidates for the last of `words` in kubectl's plugin completion format. Never
/// fails: a cluster that cannot be read offers no names.
async fn complete(words: &[String]) -> ExitCode {
    use kubectl_ferry::complete::{Offer, offer, render};
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let candidates = match offer(&cmd, words) {
        Offer::Words(w) => w,
        Offer::Nothing => Vec::new(),
        Offer::TransferNames { namespace, prefix } => {
            let names = async {
                let (client, default_ns) = commands::connect(None).await.ok()?;
                let ns = namespace.unwrap_or(default_ns);
                let api: kube::Api<ferry_api::Transfer> = kube::Api::namespaced(client, &ns);
                let list = api.list(&kube::api::ListParams::default()).await.ok()?;
                Some(
                    list.items
                        .iter()
                        .map(kube::ResourceExt::name_any)
                        .filter(|n| n.starts_with(&prefix))
                        .collect::<Vec<_>>(),
                )
            };
            tokio::time::timeout(Duration::from_secs(5), names)
                .await
                .ok()
                .flatten()
                .unwrap_or_default()
        }
    };
    let _ = std::io::stdout().write_all(render(&candidates).as_bytes());
    ExitCode::SUCCESS
}
