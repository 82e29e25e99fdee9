//! The cluster: the coordination store (etcd, or in memory for a single node), what is kept in
//! it, and the node that leads, places and runs tasks. Only `etcd.rs` knows etcd.

pub mod dirty;
pub mod etcd;
pub mod held_log;
mod leader;
mod mirror;
pub mod model;
pub mod node;
/// The claim rule's model and simulation, measured against the best possible placement.
#[cfg(test)]
mod placement;
pub mod schedule;
pub mod status;
pub mod store;
pub mod verification;
pub mod worker;
