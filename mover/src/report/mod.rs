//! Summaries and the TTY progress bar (issue 2).
