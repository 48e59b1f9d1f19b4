//! Datasets: the built-in handwritten digits, splits and shuffled batches.

use kiln_backend::Array;
use kiln_backend::random::Stream;
use ndarray::{Array2, ArrayD, Axis, IxDyn};
use std::io::Read;

/// The UCI handwritten digits (8×8 images, 1,797 of them), compiled into the library.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// Why the built-in data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// Decompression failed.
    #[error("cannot decompress the digits data: {0}")]
    Decompress(#[from] std::io::Error),
    /// A line is malformed.
    #[error("digits data, line {line}: {message}")]
    Parse {
        /// The line, from 1.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A global batch that the ranks cannot share equally.
    #[error(
        "a global batch of {global} rows does not split evenly over {ranks} ranks; \
         choose a multiple of {ranks}"
    )]
    UnevenShards {
        /// The global batch size.
        global: usize,
        /// The number of ranks.
        ranks: usize,
    },
}

/// Features `[n, d]` (f32) with integer class labels `[n]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// One row of features per example.
    pub features: Array2<f32>,
    /// The label of each example.
    pub labels: Vec<i64>,
    /// The number of classes.
    pub classes: usize,
}

/// One batch, ready to feed: features `f32[b, d]`, labels `i64[b]`.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The features.
    pub x: Array,
    /// The labels.
    pub y: Array,
}

/// The digits: pixel counts scaled to [0, 1], labels 0..9.
pub fn digits() -> Result<Dataset, DataError> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_CSV_GZ).read_to_string(&mut text)?;
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split(',').collect();
        let parse_error = |message: String| DataError::Parse {
            line: i + 1,
            message,
        };
        if fields.len() != 65 {
            return Err(parse_error(format!("{} fields, expected 65", fields.len())));
        }
        for f in &fields[..64] {
            let v: f32 = f
                .trim()
                .parse()
                .map_err(|_| parse_error(format!("`{f}` is not a number")))?;
            pixels.push(v / 16.0);
        }
        let label: i64 = fields[64]
            .trim()
            .parse()
            .map_err(|_| parse_error(format!("label `{}`", fields[64])))?;
        labels.push(label);
    }
    let n = labels.len();
    let features = Array2::from_shape_vec((n, 64), pixels).map_err(|e| DataError::Parse {
        line: 0,
        message: e.to_string(),
    })?;
    Ok(Dataset {
        features,
        labels,
        classes: 10,
    })
}

/// A seeded Fisher–Yates shuffle of `0..n`.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let stream = Stream::new(seed, 0);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (stream.bits(i as u64) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

impl Dataset {
    /// The number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The rows at `rows`, in that order.
    pub fn select(&self, rows: &[usize]) -> Dataset {
        Dataset {
            features: self.features.select(Axis(0), rows),
            labels: rows.iter().map(|&r| self.labels[r]).collect(),
            classes: self.classes,
        }
    }

    /// A shuffled split into (train, test) with `test_fraction` of the rows in test.
    pub fn split(&self, test_fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let order = permutation(self.len(), seed);
        let n_test = (self.len() as f64 * test_fraction).round() as usize;
        (self.select(&order[n_test..]), self.select(&order[..n_test]))
    }

    /// Every row as one batch.
    pub fn all(&self) -> Batch {
        self.batch(&(0..self.len()).collect::<Vec<_>>())
    }

    fn batch(&self, rows: &[usize]) -> Batch {
        let part = self.select(rows);
        let x = part.features.into_dyn();
        let y =
            ArrayD::from_shape_vec(IxDyn(&[rows.len()]), part.labels).expect("one label per row");
        Batch {
            x: Array::F32(x),
            y: Array::I64(y),
        }
    }

    /// Batches of `size` rows (the last may be smaller), shuffled with `seed` when given.
    pub fn batches(&self, size: usize, seed: Option<u64>) -> Vec<Batch> {
        let order = match seed {
            Some(s) => permutation(self.len(), s),
            None => (0..self.len()).collect(),
        };
        order
            .chunks(size.max(1))
            .map(|rows| self.batch(rows))
            .collect()
    }

    /// Rank `rank`'s shares of global batches of `global` rows, for data-parallel training
    /// over `ranks` ranks: each global batch (shuffled with `seed` when given, as
    /// [`Dataset::batches`]) split into `ranks` equal, consecutive shares. The mean of the
    /// ranks' mean gradients is then the global batch's mean gradient. A last global batch
    /// with fewer than `global` rows is dropped (its shares could not be equal), and a
    /// `global` that is not a multiple of `ranks` is an error.
    pub fn shards(
        &self,
        global: usize,
        rank: usize,
        ranks: usize,
        seed: Option<u64>,
    ) -> Result<Vec<Batch>, DataError> {
        if ranks == 0 || global == 0 || !global.is_multiple_of(ranks) || rank >= ranks {
            return Err(DataError::UnevenShards { global, ranks });
        }
        let order = match seed {
            Some(s) => permutation(self.len(), s),
            None => (0..self.len()).collect(),
        };
        let share = global / ranks;
        Ok(order
            .chunks_exact(global)
            .map(|rows| self.batch(&rows[rank * share..(rank + 1) * share]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_load_and_split() {
        let d = digits().unwrap();
        assert_eq!(d.len(), 1797);
        assert_eq!(d.features.dim(), (1797, 64));
        assert!(d.features.iter().all(|&v| (0.0..=1.0).contains(&v)));
        assert!(d.labels.iter().all(|&l| (0..10).contains(&l)));
        let (train, test) = d.split(0.2, 7);
        assert_eq!((train.len(), test.len()), (1438, 359));
        let batches = train.batches(100, Some(1));
        assert_eq!(batches.len(), 15);
        assert_eq!(batches[14].x.shape(), &[38, 64]);
        let mut order = permutation(50, 3);
        order.sort();
        assert_eq!(order, (0..50).collect::<Vec<_>>());
    }
}
