//! The demos behind the examples: each is a function with a configuration, so the examples
//! run them at full size and the tests at a small one.

pub mod data_parallel;
pub mod digits_cnn;
pub mod digits_dygraph;
pub mod digits_rnn;
pub mod digits_static;
pub mod digits_transformer;
pub mod gan_1d;
pub mod gpt;
pub mod tour;
