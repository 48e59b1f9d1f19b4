//! What a step keeps for a later step of the same run: a max pooling's argmax for its
//! gradient. The schedule pairs the steps (`schedule/pairing.rs`); a kept value is valid only in the
//! run that filled it. (Convolutions once kept their patch matrices for their filter
//! gradients; since patch matrices are built a cache-sized chunk at a time, building one
//! again costs less than keeping a whole batch's in memory.)

/// A value one step fills and a later step of the same run reads.
#[derive(Default)]
pub(crate) struct Kept<S> {
    pub(crate) value: S,
    /// Whether this run's first step filled it.
    pub(crate) valid: bool,
}

/// What a paired step does with its kept value.
pub(crate) enum Keeping<'a, S> {
    /// Nothing: the step is not paired.
    No,
    /// The first step fills it.
    Fill(&'a mut Kept<S>),
    /// The later step reads it, if this run's first step filled it.
    Read(&'a Kept<S>),
}

impl<S> Kept<S> {
    /// What a step paired by `index` does with `kept[index]`: fill it when it is the pair's
    /// `first`, read it otherwise.
    pub(crate) fn of(kept: &mut [Kept<S>], index: Option<usize>, first: bool) -> Keeping<'_, S> {
        match index {
            Some(i) if first => Keeping::Fill(&mut kept[i]),
            Some(i) => Keeping::Read(&kept[i]),
            None => Keeping::No,
        }
    }
}
