//! Malformed and ill-typed programs under `tests/diagnostics/`: each must be rejected with a
//! clear diagnostic (line, column, the offending token, what was expected), snapshotted.

use kiln::ir::parse_and_verify;

#[test]
fn malformed_programs_get_clear_diagnostics() {
    let mut count = 0;
    insta::glob!("diagnostics/*.kir", |path| {
        let source = std::fs::read_to_string(path).unwrap();
        let err = match parse_and_verify(&source) {
            Ok(_) => panic!("{} should be rejected", path.display()),
            Err(e) => e,
        };
        insta::assert_snapshot!(err.render(&source));
        count += 1;
    });
    assert!(count >= 25, "only {count} diagnostic cases");
}
