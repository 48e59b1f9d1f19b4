//! `kiln-passes`: transformations of Kiln IR.
//!
//! - [`Pass`], [`Stats`], [`PassError`]: what a pass is (`pass.rs`, which every pass alone
//!   depends on).
//! - [`manager`]: the pass manager — named passes and pipelines, timing, statistics,
//!   verification and IR dumps after each pass.
//! - [`canonicalize`], [`fold`], [`cse`], [`dce`]: the classic passes.
//! - `constants`: `place_constants`, each constant just before its first reader (one order
//!   whichever front end built the program).
//! - [`simplify`]: e-graph rewriting with egg, rules by topic, memory-traffic extraction.
//! - `layout`: convolutions, pooling and the ops between them channels last, chosen per
//!   region of the graph, with transposes only at its edges.
//! - `loops`: invariant code motion, transposed invariant operands and batched input
//!   projections in `while` bodies.
//! - `products`: how matrix products run, decided as IR (`fold_updates`: an SGD update
//!   accumulated onto by its gradient's product, `matmul_acc`).
//! - [`fusion`]: elementwise, broadcast and reduction ops grouped into `fused` kernels.
//! - `epilogues`: `order_epilogues`, the order that lets a convolution carry the kernel after
//!   it as its epilogue.
//! - [`autodiff`]: reverse-mode gradients as a pass; one vector-Jacobian rule per op.
//! - [`prune`]: the slice of a function that chosen outputs and stores need.
//!
//! Architecture invariant: a pass takes verified IR to verified IR with the same meaning,
//! checked against the reference interpreter in tests. Constant folding evaluates with the
//! interpreter's own kernels, which is why this crate depends on `kiln-backend`.

#![forbid(unsafe_code)]

pub mod autodiff;
mod canonicalize;
mod constants;
mod cse;
mod dce;
mod epilogues;
mod fold;
mod fusion;
mod layout;
mod loops;
pub mod manager;
mod pass;
mod products;
pub mod prune;
pub mod simplify;

pub use autodiff::{AutodiffError, Wrt, append_gradients, gradient_function};
pub use canonicalize::Canonicalize;
pub use constants::PlaceConstants;
pub use cse::Cse;
pub use dce::Dce;
pub use epilogues::OrderEpilogues;
pub use fold::{ConstantFold, MAX_ELEMENTS as MAX_FOLDED_ELEMENTS};
pub use fusion::{Fuse, MAX_KERNEL_DEPTH};
pub use layout::ChannelsLast;
pub use loops::Loops;
pub use manager::{PassManager, PassReport};
pub use pass::{Pass, PassError, Stats};
pub use products::FoldUpdates;
pub use prune::{prune, prune_fed};
pub use simplify::{MAX_REGION_INSTS, Simplify};
