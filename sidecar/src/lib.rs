//! taskfleet worker agent: pulls task messages from NATS JetStream, forms batches, runs them on
//! a local model runtime over a Unix socket and publishes the results.

pub mod clock;
pub mod contract;
pub mod error;
pub mod protocol;

pub use error::{Error, Result};
pub mod artifacts;
pub mod heartbeat;
pub mod members;
pub mod metrics;
pub mod nats;
pub mod placement;
pub mod residency;
pub mod runtime;
pub mod s3;
pub mod worker;

#[cfg(test)]
mod module_graph_test;
#[cfg(test)]
mod nats_server_test;
