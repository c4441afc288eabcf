//! `portverbs cmtime`: librdmacm's cmtime, the connection-setup benchmark. Its report
//! ([`report`]) is written; the run that fills it drives the connection manager's Connector
//! and Listener.

#![allow(
    dead_code,
    reason = "wired to the CLI with the CM's Listener and Connector"
)]

pub(crate) mod report;
