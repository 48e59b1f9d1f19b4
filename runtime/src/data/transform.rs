//! Per-example transforms, applied by the [`super::DataLoader`] as it makes each batch.

use super::DataError;
use kiln_backend::random::Stream;

/// A change to one example, in place. `rng` is the example's own random stream for this epoch
/// (fixed by the loader's seed, the epoch and the example), so a random transform gives the
/// same result on every run, whichever thread applies it.
pub trait Transform: Send + Sync {
    /// Changes `example`, of shape `shape` (as the dataset's `sample_shape`).
    fn apply(&self, example: &mut [f32], shape: &[usize], rng: Stream);

    /// Whether the transform applies to examples of `shape`; checked when a loader is built.
    fn check(&self, shape: &[usize]) -> Result<(), DataError> {
        let _ = shape;
        Ok(())
    }
}

/// A shared transform (as a loader holds them, or a binding hands them over).
impl Transform for std::sync::Arc<dyn Transform> {
    fn apply(&self, example: &mut [f32], shape: &[usize], rng: Stream) {
        (**self).apply(example, shape, rng)
    }

    fn check(&self, shape: &[usize]) -> Result<(), DataError> {
        (**self).check(shape)
    }
}

/// Channels, height and width of an image example `[C, H, W]` or `[H, W]`.
fn image_dims(shape: &[usize]) -> Option<(usize, usize, usize)> {
    match *shape {
        [c, h, w] => Some((c, h, w)),
        [h, w] => Some((1, h, w)),
        _ => None,
    }
}

fn need_image(what: &str, shape: &[usize]) -> Result<(), DataError> {
    image_dims(shape).map(|_| ()).ok_or_else(|| {
        DataError::Invalid(format!(
            "{what} needs image examples [C, H, W] or [H, W]; these are {shape:?}"
        ))
    })
}

/// `(x - mean) / std` per channel (the first axis of `[C, H, W]`); one value applies to all.
#[derive(Clone, Debug)]
pub struct Normalize {
    /// The mean of each channel.
    pub mean: Vec<f32>,
    /// The standard deviation of each channel.
    pub std: Vec<f32>,
}

impl Normalize {
    /// Normalisation with one `mean` and `std` for every value.
    pub fn new(mean: f32, std: f32) -> Normalize {
        Normalize {
            mean: vec![mean],
            std: vec![std],
        }
    }
}

impl Transform for Normalize {
    fn apply(&self, example: &mut [f32], shape: &[usize], _: Stream) {
        let channels = self.mean.len();
        let per_channel = if channels == 1 {
            example.len()
        } else {
            example.len() / shape[0]
        };
        for (c, chunk) in example.chunks_mut(per_channel.max(1)).enumerate() {
            let (mean, std) = (self.mean[c % channels], self.std[c % channels]);
            chunk.iter_mut().for_each(|v| *v = (*v - mean) / std);
        }
    }

    fn check(&self, shape: &[usize]) -> Result<(), DataError> {
        let n = self.mean.len();
        if n == 0 || n != self.std.len() || (n > 1 && shape.first() != Some(&n)) {
            return Err(DataError::Invalid(format!(
                "Normalize has {n} means and {} deviations for examples of shape {shape:?} \
                 (give one, or one per channel)",
                self.std.len()
            )));
        }
        if let Some(s) = self.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(DataError::Invalid(format!(
                "Normalize's standard deviation {s} is not positive"
            )));
        }
        Ok(())
    }
}

/// A random shift of up to `padding` pixels each way, filling with zeros: torchvision's
/// `RandomCrop(size, padding)` with `size` the image's own.
#[derive(Clone, Debug)]
pub struct RandomCrop {
    /// The largest shift, in pixels.
    pub padding: usize,
}

impl Transform for RandomCrop {
    fn apply(&self, example: &mut [f32], shape: &[usize], rng: Stream) {
        let Some((c, h, w)) = image_dims(shape) else {
            return;
        };
        let span = 2 * self.padding as u64 + 1;
        let dy = (rng.bits(0) % span) as isize - self.padding as isize;
        let dx = (rng.bits(1) % span) as isize - self.padding as isize;
        let source = example.to_vec();
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    let (sy, sx) = (y as isize + dy, x as isize + dx);
                    let inside = (0..h as isize).contains(&sy) && (0..w as isize).contains(&sx);
                    example[(ch * h + y) * w + x] = if inside {
                        source[(ch * h + sy as usize) * w + sx as usize]
                    } else {
                        0.0
                    };
                }
            }
        }
    }

    fn check(&self, shape: &[usize]) -> Result<(), DataError> {
        need_image("RandomCrop", shape)
    }
}

/// A left–right mirror with probability `p`.
#[derive(Clone, Debug)]
pub struct RandomHorizontalFlip {
    /// The probability of a flip.
    pub p: f64,
}

impl Transform for RandomHorizontalFlip {
    fn apply(&self, example: &mut [f32], shape: &[usize], rng: Stream) {
        let Some((_, _, w)) = image_dims(shape) else {
            return;
        };
        if rng.unit(2) < self.p {
            example.chunks_mut(w).for_each(<[f32]>::reverse);
        }
    }

    fn check(&self, shape: &[usize]) -> Result<(), DataError> {
        need_image("RandomHorizontalFlip", shape)
    }
}
