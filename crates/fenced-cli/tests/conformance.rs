//! The shared conformance suite on every backend this build has.

fenced_testkit::conformance_suite!(memory, fenced_testkit::Fixture::memory());

fenced_testkit::conformance_suite!(
    sqlite,
    fenced_testkit::Fixture::sqlite(env!("CARGO_BIN_EXE_fenced")),
    processes
);

fenced_testkit::conformance_suite!(
    redis,
    fenced_testkit::Fixture::redis(env!("CARGO_BIN_EXE_fenced")),
    processes
);

fenced_testkit::conformance_suite!(
    redis_simple,
    fenced_testkit::Fixture::redis_with(env!("CARGO_BIN_EXE_fenced"), "?layout=simple"),
    processes,
    mutex_only
);

fenced_testkit::conformance_suite!(
    redlock,
    fenced_testkit::Fixture::redlock(env!("CARGO_BIN_EXE_fenced")),
    processes,
    no_fair_no_permits
);

fenced_testkit::conformance_suite!(
    redis_sentinel,
    fenced_testkit::Fixture::redis_sentinel(env!("CARGO_BIN_EXE_fenced"))
);

fenced_testkit::conformance_suite!(
    redis_cluster,
    fenced_testkit::Fixture::redis_cluster(env!("CARGO_BIN_EXE_fenced"))
);

fenced_testkit::conformance_suite!(
    postgres,
    fenced_testkit::Fixture::postgres(env!("CARGO_BIN_EXE_fenced")),
    processes
);

fenced_testkit::conformance_suite!(
    postgres_advisory,
    fenced_testkit::Fixture::postgres_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    processes,
    no_fair_no_permits
);

fenced_testkit::conformance_suite!(
    mariadb,
    fenced_testkit::Fixture::mariadb(env!("CARGO_BIN_EXE_fenced")),
    processes
);

fenced_testkit::conformance_suite!(
    mariadb_advisory,
    fenced_testkit::Fixture::mariadb_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    processes,
    mutex_only_no_fair
);

#[cfg(feature = "etcd")]
fenced_testkit::conformance_suite!(
    etcd,
    fenced_testkit::Fixture::etcd(env!("CARGO_BIN_EXE_fenced"), 1),
    processes
);

#[cfg(feature = "etcd")]
fenced_testkit::conformance_suite!(
    etcd_cluster,
    fenced_testkit::Fixture::etcd(env!("CARGO_BIN_EXE_fenced"), 3)
);

#[cfg(feature = "zookeeper")]
fenced_testkit::conformance_suite!(
    zookeeper,
    fenced_testkit::Fixture::zookeeper(env!("CARGO_BIN_EXE_fenced"), 1),
    processes
);

#[cfg(feature = "zookeeper")]
fenced_testkit::conformance_suite!(
    zookeeper_ensemble,
    fenced_testkit::Fixture::zookeeper(env!("CARGO_BIN_EXE_fenced"), 3)
);
