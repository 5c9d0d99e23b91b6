//! The shared conformance suite on every backend this build has.

fenced_testkit::conformance_suite!(memory, fenced_testkit::Fixture::memory());

fenced_testkit::conformance_suite!(
    sqlite,
    fenced_testkit::Fixture::sqlite(env!("CARGO_BIN_EXE_fenced")),
    processes
);
