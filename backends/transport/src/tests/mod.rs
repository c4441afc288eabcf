//! Unit tests of the engine's three machines, sans-IO: one engine with one QP and a test
//! [`Hca`](super::Hca) whose queues are vectors; the test plays the peer, feeding packets built
//! from the wire representations and asserting on the packets, completions and events that
//! come out.

mod harness;

mod completer;
mod congestion;
mod modify;
mod read;
mod requester;
mod responder;
mod window;

mod frames;
mod fuzz;
