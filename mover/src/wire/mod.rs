//! Sans-IO frame codec (issue 4).
