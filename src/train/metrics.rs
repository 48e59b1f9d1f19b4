//! Classification metrics from logits: loss, accuracy, top-k accuracy, a confusion matrix.

use kiln_backend::Array;

/// What a pass over data measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// The mean loss per example.
    pub loss: f64,
    /// The fraction of examples whose largest logit is their label.
    pub accuracy: f64,
    /// The fraction whose label is among the `k` largest logits.
    pub top_k: f64,
    /// The `k` of `top_k`.
    pub k: usize,
    /// The number of examples.
    pub examples: usize,
}

/// Sums over batches, turned into [`Metrics`] at the end.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Running {
    pub(crate) loss: f64,
    pub(crate) correct: f64,
    pub(crate) top_k: f64,
    pub(crate) examples: f64,
}

/// For each row of a batch: its label, its best class, and how many classes score above the
/// label (0 when it is the best).
pub(crate) fn label_ranks(logits: &Array, labels: &Array) -> Vec<(usize, usize, usize)> {
    let classes = logits.shape().last().copied().unwrap_or(1).max(1);
    let values = logits.to_f64_vec();
    let labels = labels.to_f64_vec();
    values
        .chunks(classes)
        .zip(labels)
        .map(|(row, label)| {
            let label = label as usize;
            let score = row.get(label).copied().unwrap_or(f64::NAN);
            let above = row.iter().filter(|&&v| v > score).count();
            let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            (label, best, above)
        })
        .collect()
}

impl Running {
    /// Adds a batch: its mean `loss` and its rows' [`label_ranks`].
    pub(crate) fn add(&mut self, loss: f64, rows: &[(usize, usize, usize)], k: usize) {
        let n = rows.len() as f64;
        self.loss += loss * n;
        self.examples += n;
        self.correct += rows.iter().filter(|(l, best, _)| l == best).count() as f64;
        self.top_k += rows.iter().filter(|(_, _, above)| *above < k).count() as f64;
    }

    pub(crate) fn finish(&self, k: usize) -> Metrics {
        let per = |v: f64| {
            if self.examples > 0.0 {
                v / self.examples
            } else {
                f64::NAN
            }
        };
        Metrics {
            loss: per(self.loss),
            accuracy: per(self.correct),
            top_k: per(self.top_k),
            k,
            examples: self.examples as usize,
        }
    }

    pub(crate) fn to_vec(&self) -> Vec<f64> {
        vec![self.loss, self.correct, self.top_k, self.examples]
    }

    pub(crate) fn from_slice(v: &[f64]) -> Running {
        Running {
            loss: v[0],
            correct: v[1],
            top_k: v[2],
            examples: v[3],
        }
    }
}

/// Counts of (true class, predicted class).
#[derive(Clone, Debug, PartialEq)]
pub struct ConfusionMatrix {
    /// `counts[true][predicted]`.
    pub counts: Vec<Vec<usize>>,
}

impl ConfusionMatrix {
    /// An empty matrix over `classes` classes.
    pub fn new(classes: usize) -> ConfusionMatrix {
        ConfusionMatrix {
            counts: vec![vec![0; classes]; classes],
        }
    }

    /// Adds a batch's predictions.
    pub fn add(&mut self, logits: &Array, labels: &Array) {
        self.add_rows(&label_ranks(logits, labels));
    }

    /// Adds a batch's rows, as [`label_ranks`] gives them.
    pub(crate) fn add_rows(&mut self, rows: &[(usize, usize, usize)]) {
        let classes = self.counts.len();
        for &(label, best, _) in rows {
            if label < classes && best < classes {
                self.counts[label][best] += 1;
            }
        }
    }

    /// The fraction of each true class predicted correctly (recall).
    pub fn per_class_accuracy(&self) -> Vec<f64> {
        (self.counts.iter().enumerate())
            .map(|(c, row)| row[c] as f64 / row.iter().sum::<usize>().max(1) as f64)
            .collect()
    }
}
