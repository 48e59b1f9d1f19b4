//! The [`DataLoader`]: seeded shuffling, batching, transforms, sharding across ranks, and
//! batches made ahead on a background thread.

use super::{Batch, DataError, Dataset, Transform, permutation, shard_share};
use kiln_backend::Array;
use kiln_backend::random::Stream;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// Batches of a [`Dataset`], epoch after epoch.
///
/// Epoch `e` visits the examples in the order of a permutation seeded with `seed + e` (or in
/// their own order without [`DataLoader::shuffle`]), so every run sees the same batches.
/// Batches are made on a background thread, [`DataLoader::prefetch`] of them ahead of the
/// training step, with the transforms applied to each example.
///
/// ```
/// use kiln_runtime::data::{self, DataLoader, Normalize};
/// let digits = data::digits()?;
/// let loader = DataLoader::new(digits, 100)
///     .shuffle(7)
///     .drop_last(true)
///     .transform(Normalize::new(0.5, 0.25));
/// assert_eq!(loader.len(), 17); // 1,797 examples: 17 full batches of 100
/// for batch in loader.epoch(0)? {
///     let batch = batch?;
///     assert_eq!(batch.x.shape(), &[100, 64]);
/// }
/// # Ok::<(), data::DataError>(())
/// ```
#[derive(Clone)]
pub struct DataLoader {
    dataset: Arc<Dataset>,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    transforms: Vec<Arc<dyn Transform>>,
    prefetch: usize,
    rank: usize,
    ranks: usize,
}

impl DataLoader {
    /// Batches of `batch_size` examples of `dataset`, in order, the last one possibly smaller,
    /// two made ahead.
    pub fn new(dataset: impl Into<Arc<Dataset>>, batch_size: usize) -> DataLoader {
        DataLoader {
            dataset: dataset.into(),
            batch_size: batch_size.max(1),
            seed: None,
            drop_last: false,
            transforms: Vec::new(),
            prefetch: 2,
            rank: 0,
            ranks: 1,
        }
    }

    /// Shuffles each epoch, with `seed + epoch`.
    pub fn shuffle(mut self, seed: u64) -> DataLoader {
        self.seed = Some(seed);
        self
    }

    /// Drops the last batch of an epoch when it is smaller than the others.
    pub fn drop_last(mut self, drop: bool) -> DataLoader {
        self.drop_last = drop;
        self
    }

    /// Applies `transform` to each example, after the transforms added before it.
    pub fn transform(mut self, transform: impl Transform + 'static) -> DataLoader {
        self.transforms.push(Arc::new(transform));
        self
    }

    /// Makes up to `batches` batches ahead on a background thread (0: in the caller's thread,
    /// when asked for).
    pub fn prefetch(mut self, batches: usize) -> DataLoader {
        self.prefetch = batches;
        self
    }

    /// Rank `rank` of `ranks`' share of each batch, for data-parallel training: every batch
    /// of `batch_size` examples (the global batch) is split into `ranks` equal, consecutive
    /// shares, so the ranks together see the global order. A last, smaller batch is dropped,
    /// since its shares could not be equal; a batch size that `ranks` does not divide is an
    /// error.
    pub fn shard(mut self, rank: usize, ranks: usize) -> Result<DataLoader, DataError> {
        shard_share(self.batch_size, rank, ranks)?;
        (self.rank, self.ranks) = (rank, ranks);
        Ok(self)
    }

    /// The dataset batched.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// The number of examples in a (global) batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The number of batches in an epoch.
    pub fn len(&self) -> usize {
        let n = self.dataset.len();
        if self.drop_last || self.ranks > 1 {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The examples of each batch of `epoch` (this rank's share when sharded).
    pub fn epoch_rows(&self, epoch: usize) -> Vec<Vec<usize>> {
        let n = self.dataset.len();
        let order = match self.seed {
            Some(seed) => permutation(n, seed.wrapping_add(epoch as u64)),
            None => (0..n).collect(),
        };
        let share =
            shard_share(self.batch_size, self.rank, self.ranks).expect("checked when sharded");
        let mut rows: Vec<Vec<usize>> = order
            .chunks(self.batch_size)
            .map(|global| global.get(share.clone()).unwrap_or(global).to_vec())
            .collect();
        rows.truncate(self.len());
        rows
    }

    /// The batches of `epoch` (from 0).
    pub fn epoch(&self, epoch: usize) -> Result<Batches, DataError> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from its `first` batch on: where a run resumed mid-epoch goes on.
    /// An error if a transform does not apply to the examples.
    pub fn epoch_from(&self, epoch: usize, first: usize) -> Result<Batches, DataError> {
        for t in &self.transforms {
            t.check(&self.dataset.sample_shape)?;
        }
        let rows: Vec<Vec<usize>> = self.epoch_rows(epoch).into_iter().skip(first).collect();
        let maker = BatchMaker {
            dataset: self.dataset.clone(),
            transforms: self.transforms.clone(),
            seed: self.seed.unwrap_or(0).wrapping_add(epoch as u64),
        };
        if self.prefetch == 0 {
            let rows = rows.into_iter();
            return Ok(Batches {
                source: Source::Inline { maker, rows },
            });
        }
        let (sender, receiver) = sync_channel(self.prefetch);
        let count = rows.len();
        let worker = std::thread::Builder::new()
            .name("kiln-data".into())
            .spawn(move || {
                for r in rows {
                    if sender.send(maker.make(&r)).is_err() {
                        return; // the consumer stopped early
                    }
                }
            })
            .map_err(|e| DataError::Invalid(format!("cannot start the data thread: {e}")))?;
        Ok(Batches {
            source: Source::Prefetched {
                receiver: Some(receiver),
                worker: Some(worker),
                left: count,
            },
        })
    }
}

/// Makes one batch: the rows gathered, then each example transformed.
struct BatchMaker {
    dataset: Arc<Dataset>,
    transforms: Vec<Arc<dyn Transform>>,
    seed: u64,
}

impl BatchMaker {
    fn make(&self, rows: &[usize]) -> Batch {
        let mut batch = self.dataset.batch(rows);
        if self.transforms.is_empty() {
            return batch;
        }
        let shape = &self.dataset.sample_shape;
        let width = self.dataset.features.ncols().max(1);
        if let Array::F32(x) = &mut batch.x {
            let values = x.as_slice_mut().expect("a batch is in standard layout");
            for (example, &row) in values.chunks_mut(width).zip(rows) {
                let rng = Stream::new(self.seed, row as u64);
                self.transforms
                    .iter()
                    .for_each(|t| t.apply(example, shape, rng));
            }
        }
        batch
    }
}

/// The batches of one epoch, in order (each a `Result`: a failed background thread is an
/// error, never a silently shorter epoch).
pub struct Batches {
    source: Source,
}

enum Source {
    /// Made when asked for.
    Inline {
        maker: BatchMaker,
        rows: std::vec::IntoIter<Vec<usize>>,
    },
    /// Made ahead on a background thread.
    Prefetched {
        receiver: Option<Receiver<Batch>>,
        worker: Option<JoinHandle<()>>,
        left: usize,
    },
}

impl Iterator for Batches {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.source {
            Source::Inline { maker, rows } => rows.next().map(|r| Ok(maker.make(&r))),
            Source::Prefetched { left: 0, .. } => None,
            Source::Prefetched {
                receiver,
                worker,
                left,
            } => match receiver.as_ref().map(Receiver::recv) {
                Some(Ok(batch)) => {
                    *left -= 1;
                    Some(Ok(batch))
                }
                _ => {
                    *left = 0;
                    let why = match worker.take().map(JoinHandle::join) {
                        Some(Err(panic)) => panic_message(&panic),
                        _ => "it stopped early".into(),
                    };
                    Some(Err(DataError::Invalid(format!(
                        "the data thread failed: {why}"
                    ))))
                }
            },
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.source {
            Source::Inline { rows, .. } => rows.len(),
            Source::Prefetched { left, .. } => *left,
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches {}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    (panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

impl Drop for Batches {
    fn drop(&mut self) {
        if let Source::Prefetched {
            receiver, worker, ..
        } = &mut self.source
        {
            // Closing the channel ends a worker waiting to send; then wait for it.
            receiver.take();
            if let Some(w) = worker.take() {
                let _ = w.join();
            }
        }
    }
}
