//! Datasets and the loader: IDX, `.npy` and CSV files (and their bad forms), seeded order,
//! prefetching, transforms and sharding.

use kiln_backend::Array;
use kiln_runtime::data::{
    self, DataError, DataLoader, Dataset, Normalize, RandomCrop, RandomHorizontalFlip,
};
use ndarray::{ArrayD, IxDyn};
use std::io::Write;
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn idx_bytes(dims: &[u32], values: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    dims.iter().for_each(|d| bytes.extend(d.to_be_bytes()));
    bytes.extend(values);
    bytes
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A tiny MNIST-format folder: `n` training and 2 test images of 4×4, labels `i % 10`, the
/// training files gzipped.
fn mnist_dir(name: &str, n: u32) -> PathBuf {
    let dir = temp_dir(name);
    let pixels = |n: u32| (0..n * 16).map(|i| (i % 256) as u8).collect::<Vec<_>>();
    let labels = |n: u32| (0..n).map(|i| (i % 10) as u8).collect::<Vec<_>>();
    let write = |file: &str, bytes: Vec<u8>| std::fs::write(dir.join(file), bytes).unwrap();
    write(
        "train-images-idx3-ubyte.gz",
        gzip(&idx_bytes(&[n, 4, 4], &pixels(n))),
    );
    write(
        "train-labels-idx1-ubyte.gz",
        gzip(&idx_bytes(&[n], &labels(n))),
    );
    write("t10k-images-idx3-ubyte", idx_bytes(&[2, 4, 4], &pixels(2)));
    write("t10k-labels-idx1-ubyte", idx_bytes(&[2], &labels(2)));
    dir
}

fn error_text(result: Result<data::Images, DataError>) -> String {
    result.expect_err("the folder is bad").to_string()
}

#[test]
fn mnist_folders_load_gzipped_or_not() {
    let dir = mnist_dir("good", 12);
    let images = data::mnist(&dir).unwrap();
    assert_eq!(images.train.len(), 12);
    assert_eq!(images.test.len(), 2);
    assert_eq!(images.train.sample_shape, vec![1, 4, 4]);
    assert_eq!(images.train.labels[11], 1);
    assert_eq!(images.train.features[[1, 0]], 16.0 / 255.0);
    assert_eq!(images.source, data::ImageSource::Mnist(dir.clone()));
    let batch = images.train.batch(&[3, 4]);
    assert_eq!(batch.x.shape(), &[2, 1, 4, 4]);
    // A folder named in `images` must be one.
    assert!(data::images(Some(&dir)).is_ok());
    let not = temp_dir("empty");
    let message = error_text(data::images(Some(&not)));
    assert!(message.contains("train-images-idx3-ubyte"), "{message}");
    assert!(message.contains(&not.display().to_string()), "{message}");
}

#[test]
fn bad_idx_files_are_errors_naming_the_file() {
    type Spoil = Box<dyn Fn(&Path)>;
    let cases: [(&str, Spoil, &str); 5] = [
        (
            "truncated",
            Box::new(|d| {
                let f = d.join("t10k-images-idx3-ubyte");
                let bytes = std::fs::read(&f).unwrap();
                std::fs::write(&f, &bytes[..bytes.len() - 5]).unwrap();
            }),
            "t10k-images-idx3-ubyte: its header says [2, 4, 4] (32 values) but it holds 27",
        ),
        (
            "corrupt-gzip",
            Box::new(|d| {
                let f = d.join("train-images-idx3-ubyte.gz");
                let bytes = std::fs::read(&f).unwrap();
                std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
            }),
            "train-images-idx3-ubyte.gz: corrupt or truncated gzip data",
        ),
        (
            "label-range",
            Box::new(|d| {
                std::fs::write(d.join("t10k-labels-idx1-ubyte"), idx_bytes(&[2], &[3, 12]))
                    .unwrap();
            }),
            "t10k-labels-idx1-ubyte: label 12 of example 1 is outside the 10 classes",
        ),
        (
            "counts",
            Box::new(|d| {
                std::fs::write(
                    d.join("t10k-labels-idx1-ubyte"),
                    idx_bytes(&[3], &[1, 2, 3]),
                )
                .unwrap();
            }),
            "t10k-labels-idx1-ubyte: holds labels of shape [3], but",
        ),
        (
            "not-idx",
            Box::new(|d| std::fs::write(d.join("t10k-labels-idx1-ubyte"), b"hello").unwrap()),
            "t10k-labels-idx1-ubyte: not an IDX file",
        ),
    ];
    for (name, spoil, expected) in cases {
        let dir = mnist_dir(name, 12);
        spoil(&dir);
        let message = error_text(data::mnist(&dir));
        assert!(message.contains(expected), "{name}: {message}");
        assert!(message.contains(&dir.display().to_string()), "{message}");
    }
}

#[test]
fn npy_and_csv_files() {
    let dir = temp_dir("files");
    let x = Array::F32(ArrayD::from_shape_fn(IxDyn(&[5, 2, 3]), |i| i[0] as f32));
    let y = Array::I64(ArrayD::from_shape_vec(IxDyn(&[5]), vec![0, 1, 2, 1, 0]).unwrap());
    kiln_runtime::npy::write_npy(&dir.join("x.npy"), &x).unwrap();
    kiln_runtime::npy::write_npy(&dir.join("y.npy"), &y).unwrap();
    let d = data::npy(&dir.join("x.npy"), &dir.join("y.npy"), None).unwrap();
    assert_eq!(
        (d.len(), d.classes, d.sample_shape.clone()),
        (5, 3, vec![2, 3])
    );
    let short = Array::I64(ArrayD::from_shape_vec(IxDyn(&[4]), vec![0, 1, 2, 1]).unwrap());
    kiln_runtime::npy::write_npy(&dir.join("short.npy"), &short).unwrap();
    let e = data::npy(&dir.join("x.npy"), &dir.join("short.npy"), None).unwrap_err();
    assert!(
        e.to_string()
            .contains("5 examples of features but 4 labels"),
        "{e}"
    );

    let csv = dir.join("iris.csv");
    std::fs::write(&csv, "a,b,label\n1,2,0\n3,4.25,2\n\n5,6,1\n").unwrap();
    let d = data::csv(&csv, None).unwrap();
    assert_eq!(d.labels, vec![0, 2, 1]);
    assert_eq!(d.features.row(1).to_vec(), vec![3.0, 4.25]);
    let d = data::csv(&csv, Some(0)).unwrap();
    assert_eq!(d.labels, vec![1, 3, 5]);
    std::fs::write(&csv, "1,2,0\n3,x,1\n").unwrap();
    let e = data::csv(&csv, None).unwrap_err().to_string();
    assert!(e.contains("iris.csv: line 2: `x` is not a number"), "{e}");
    std::fs::write(&csv, "1,2,0\n3,1\n").unwrap();
    let e = data::csv(&csv, None).unwrap_err().to_string();
    assert!(e.contains("line 2: 2 fields, the first line has 3"), "{e}");
}

fn small(n: usize) -> Dataset {
    let x = ArrayD::from_shape_fn(IxDyn(&[n, 1, 2, 3]), |i| {
        (i[0] * 6 + i[2] * 3 + i[3]) as f32
    });
    Dataset::new(x, (0..n as i64).map(|i| i % 4).collect(), None).unwrap()
}

fn labels_of(loader: &DataLoader, epoch: usize) -> Vec<Vec<i64>> {
    loader
        .epoch(epoch)
        .unwrap()
        .map(|b| {
            b.unwrap()
                .y
                .to_f64_vec()
                .iter()
                .map(|&v| v as i64)
                .collect()
        })
        .collect()
}

#[test]
fn loader_order_is_seeded_complete_and_the_same_prefetched_or_not() {
    let d = Dataset::new(
        ArrayD::from_shape_fn(IxDyn(&[10, 1]), |i| i[0] as f32),
        (0..10).collect(),
        None,
    )
    .unwrap();
    let loader = DataLoader::new(d, 4).shuffle(3);
    assert_eq!(loader.len(), 3);
    let first = labels_of(&loader, 0);
    assert_eq!(first.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 2]);
    let mut all: Vec<i64> = first.concat();
    all.sort();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    assert_eq!(
        first,
        labels_of(&loader, 0),
        "the same seed, the same order"
    );
    assert_ne!(first, labels_of(&loader, 1), "another epoch, another order");
    assert_eq!(first, labels_of(&loader.clone().prefetch(0), 0));
    let dropped = loader.clone().drop_last(true);
    assert_eq!(labels_of(&dropped, 0), first[..2].to_vec());
    let resumed: Vec<Vec<i64>> = (loader.epoch_from(0, 1).unwrap())
        .map(|b| {
            b.unwrap()
                .y
                .to_f64_vec()
                .iter()
                .map(|&v| v as i64)
                .collect()
        })
        .collect();
    assert_eq!(resumed, first[1..].to_vec());
    // The digits' epoch order is the examples' earlier `batches` order.
    let digits = data::digits().unwrap();
    let old = digits.batches(64, Some(5));
    let new = DataLoader::new(digits, 64).shuffle(5);
    for (a, b) in old.iter().zip(new.epoch(0).unwrap()) {
        assert_eq!(a.y.to_f64_vec(), b.unwrap().y.to_f64_vec());
    }
    // A loop that stops early ends the worker.
    let mut batches = loader.epoch(0).unwrap();
    batches.next();
    drop(batches);
}

#[test]
fn shards_together_are_the_global_batch() {
    let d = small(10);
    let global = DataLoader::new(d.clone(), 4).shuffle(1);
    let shards: Vec<_> = (0..2)
        .map(|r| global.clone().shard(r, 2).unwrap())
        .collect();
    assert_eq!(shards[0].len(), 2, "the partial global batch is dropped");
    let whole = labels_of(&global, 0);
    let parts: Vec<_> = shards.iter().map(|s| labels_of(s, 0)).collect();
    for b in 0..2 {
        assert_eq!(
            [parts[0][b].clone(), parts[1][b].clone()].concat(),
            whole[b]
        );
    }
    let e = DataLoader::new(d, 5).shard(0, 2).err().unwrap();
    assert!(
        e.to_string().contains("does not split evenly over 2 ranks"),
        "{e}"
    );
}

#[test]
fn transforms_are_seeded_per_example() {
    let d = small(6);
    let flip = DataLoader::new(d.clone(), 6).transform(RandomHorizontalFlip { p: 1.0 });
    let x = flip
        .epoch(0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .x
        .to_f64_vec();
    assert_eq!(&x[..6], &[2.0, 1.0, 0.0, 5.0, 4.0, 3.0]);
    let crop = DataLoader::new(d.clone(), 6)
        .shuffle(9)
        .transform(RandomCrop { padding: 1 })
        .transform(Normalize::new(1.0, 2.0));
    let a = crop
        .epoch(2)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .x
        .to_f64_vec();
    let b = crop
        .clone()
        .prefetch(0)
        .epoch(2)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(a, b.x.to_f64_vec());
    let c = crop
        .epoch(3)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .x
        .to_f64_vec();
    assert_ne!(a, c, "each epoch draws again");
    let flat = Dataset::new(ArrayD::zeros(IxDyn(&[2, 5])), vec![0, 1], None).unwrap();
    let e = DataLoader::new(flat, 2)
        .transform(RandomCrop { padding: 2 })
        .epoch(0)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("RandomCrop needs image examples"),
        "{e}"
    );
}

#[test]
fn datasets_refuse_labels_that_do_not_fit() {
    let e = Dataset::new(ArrayD::zeros(IxDyn(&[2, 3])), vec![0, 5], Some(3)).unwrap_err();
    assert!(
        e.to_string().contains("label 5 of example 1 is outside"),
        "{e}"
    );
    let e = data::digits()
        .unwrap()
        .with_sample_shape(&[1, 7, 7])
        .unwrap_err();
    assert!(e.to_string().contains("cannot be seen as [1, 7, 7]"), "{e}");
}
