//! Sender and receiver state machines (issue 4).
