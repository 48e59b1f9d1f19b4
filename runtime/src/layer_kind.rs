//! **The layer table**: every built-in layer kind, by the name front ends call it, with the
//! forms it comes in — an eager layer (`eager::nn`), a static layer over a program
//! (`layers`), a function of tensors (`kiln.nn.functional`). A front end parses a kind once
//! ([`LayerKind::parse`]) and matches on [`LayerKind`] exhaustively, so a kind added here is a
//! compile error in every dispatcher until each says what it does with it; Python's test
//! (`python/tests/test_layer_table.py`) checks the package's kinds against [`LayerKind::ALL`].
//! The book's "Adding a layer" page is the checklist.

use std::fmt;

/// A form a layer kind comes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerForm {
    /// An eager layer holding its parameters (`kiln.nn.Conv2d`).
    Eager,
    /// A static layer adding its parameters and ops to a program (`kiln.layers.conv2d`).
    Static,
    /// A function of tensors, parameters passed in (`kiln.nn.functional.conv2d`).
    Functional,
}

impl LayerForm {
    /// The form's name, as errors and Python's table spell it.
    pub fn name(self) -> &'static str {
        match self {
            LayerForm::Eager => "eager",
            LayerForm::Static => "static",
            LayerForm::Functional => "functional",
        }
    }
}

impl fmt::Display for LayerForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a name is not a layer of the asked form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerKindError {
    /// No layer kind has the name.
    #[error("Kiln has no {form} layer `{name}` (the {form} layers are: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The form asked for.
        form: LayerForm,
        /// The kinds that have that form, comma-separated.
        known: String,
    },
    /// The kind exists but not in this form.
    #[error("`{kind}` has no {form} form (it has: {has})")]
    NoForm {
        /// The kind's name.
        kind: &'static str,
        /// The form asked for.
        form: LayerForm,
        /// The forms it has, comma-separated.
        has: String,
    },
}

macro_rules! layer_kinds {
    ($($(#[$doc:meta])* $kind:ident = $name:literal: [$($form:ident),+];)*) => {
        /// A built-in layer kind (see the module documentation).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum LayerKind {
            $($(#[$doc])* $kind,)*
        }

        impl LayerKind {
            /// Every kind, in the table's order.
            pub const ALL: &'static [LayerKind] = &[$(LayerKind::$kind),*];

            /// The name front ends call the kind by.
            pub fn name(self) -> &'static str {
                match self {
                    $(LayerKind::$kind => $name,)*
                }
            }

            /// The forms the kind comes in.
            pub fn forms(self) -> &'static [LayerForm] {
                match self {
                    $(LayerKind::$kind => &[$(LayerForm::$form),+],)*
                }
            }
        }
    };
}

layer_kinds! {
    /// A 2-D convolution, with a bias.
    Conv2d = "conv2d": [Eager, Static, Functional];
    /// Max pooling over 2-D windows.
    MaxPool2d = "max_pool2d": [Eager, Static, Functional];
    /// Average pooling over 2-D windows.
    AvgPool2d = "avg_pool2d": [Eager, Static, Functional];
    /// The mean of each channel's plane.
    GlobalAvgPool = "global_avg_pool": [Eager, Static];
    /// Every axis but the first made one.
    Flatten = "flatten": [Eager, Functional];
    /// Batch normalisation with running statistics.
    BatchNorm = "batch_norm": [Eager];
    /// Layer normalisation over the last axis, with a scale and a shift.
    LayerNorm = "layer_norm": [Eager, Static, Functional];
    /// A long short-term memory layer over `[N, T, D]`.
    Lstm = "lstm": [Eager, Static];
    /// A gated recurrent unit layer over `[N, T, D]`.
    Gru = "gru": [Eager, Static];
    /// A table of vectors looked up by integer indices.
    Embedding = "embedding": [Eager, Static, Functional];
    /// One head of scaled dot-product self-attention.
    SelfAttention = "self_attention": [Eager, Static];
    /// Multi-head attention, optionally causal.
    MultiHeadAttention = "multi_head_attention": [Eager];
    /// A transformer encoder layer: attention and a feed-forward block, each with a residual
    /// and a layer norm.
    TransformerEncoderLayer = "transformer_encoder_layer": [Eager];
    /// A GPT: token and position embeddings, causal pre-norm blocks, the tied output head.
    Gpt = "gpt": [Eager];
    /// Dropout, active in training.
    Dropout = "dropout": [Eager, Functional];
    /// The Gaussian error linear unit, with the exact normal CDF.
    Gelu = "gelu": [Functional];
}

impl LayerKind {
    /// The kind called `name`, when it has `form`.
    pub fn parse(name: &str, form: LayerForm) -> Result<LayerKind, LayerKindError> {
        let Some(&kind) = LayerKind::ALL.iter().find(|k| k.name() == name) else {
            let known: Vec<&str> = (LayerKind::ALL.iter())
                .filter(|k| k.forms().contains(&form))
                .map(|k| k.name())
                .collect();
            return Err(LayerKindError::Unknown {
                name: name.to_owned(),
                form,
                known: known.join(", "),
            });
        };
        if kind.forms().contains(&form) {
            Ok(kind)
        } else {
            Err(kind.no_form(form))
        }
    }

    /// The error for this kind asked for in a form it does not have: the arm a dispatcher's
    /// exhaustive match gives such kinds.
    pub fn no_form(self, form: LayerForm) -> LayerKindError {
        let has: Vec<&str> = self.forms().iter().map(|f| f.name()).collect();
        LayerKindError::NoForm {
            kind: self.name(),
            form,
            has: has.join(", "),
        }
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        for &kind in LayerKind::ALL {
            for &form in kind.forms() {
                assert_eq!(LayerKind::parse(kind.name(), form), Ok(kind));
            }
            let named = LayerKind::ALL.iter().filter(|k| k.name() == kind.name());
            assert_eq!(named.count(), 1, "{kind} twice");
        }
    }

    #[test]
    fn unknown_names_and_missing_forms_are_errors_that_list_what_exists() {
        let err = LayerKind::parse("conv3d", LayerForm::Static).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Kiln has no static layer `conv3d` (the static layers are: conv2d, max_pool2d, \
             avg_pool2d, global_avg_pool, layer_norm, lstm, gru, embedding, self_attention)"
        );
        let err = LayerKind::parse("batch_norm", LayerForm::Functional).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`batch_norm` has no functional form (it has: eager)"
        );
    }
}
