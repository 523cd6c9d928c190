//! Source scanning, destination confinement and metadata (issue 2).
