//! Local parallel copy engine (issue 2).
