//! `--exclude` / `--include` for copy and send: rules in command-line order.

use std::sync::Arc;

use crate::tree::{Filter, FilterError};

#[derive(clap::Args, Debug, Default)]
pub struct FilterArgs {
    /// Leave out entries matching PATTERN (rsync rules: `*.tmp` any such name, `/cache` only at
    /// the top, `logs/*.gz` a path tail, `build/` directories only, `**` crosses `/`). With
    /// --delete, destination entries it matches are kept. Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Keep entries matching PATTERN even if a later --exclude matches them; the first matching
    /// rule decides (`--include '*/' --include '*.txt' --exclude '*'`). Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<String>,
    /// Both kinds of rule in the order they were given (filled in after parsing).
    #[arg(skip)]
    pub ordered: Vec<(bool, String)>,
}

impl FilterArgs {
    /// Records the order of the rules from the parsed command line (clap keeps each flag's
    /// values apart, while the first matching rule is the one that counts).
    pub fn order_from(&mut self, m: &clap::ArgMatches) {
        let mut rules: Vec<(usize, bool, String)> = Vec::new();
        for (id, include) in [("exclude", false), ("include", true)] {
            if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<String>(id)) {
                rules.extend(idx.zip(vals).map(|(i, v)| (i, include, v.clone())));
            }
        }
        rules.sort_by_key(|r| r.0);
        self.ordered = rules.into_iter().map(|(_, inc, v)| (inc, v)).collect();
    }

    pub fn compile(&self) -> Result<Arc<Filter>, FilterError> {
        // Without order_from (the library called directly) excludes come first.
        let ordered: Vec<(bool, &str)> = if self.ordered.is_empty() {
            self.exclude
                .iter()
                .map(|p| (false, p.as_str()))
                .chain(self.include.iter().map(|p| (true, p.as_str())))
                .collect()
        } else {
            self.ordered.iter().map(|(i, p)| (*i, p.as_str())).collect()
        };
        Ok(Arc::new(Filter::new(ordered)?))
    }
}
