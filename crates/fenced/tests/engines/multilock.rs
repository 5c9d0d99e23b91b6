//! MultiLock's order across processes that name one backend differently.

/// Two clients of one SQLite file, named by two paths, are one backend to
/// MultiLock: locks of two backends are taken in the same order whatever
/// the spelling, so two MultiLocks over the same locks cannot each hold
/// one and wait for the other.
#[tokio::test]
async fn one_backend_however_its_url_is_spelled() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let connect = |url: String| async move { fenced::Client::connect(&url).await.unwrap() };
    // The spellings sort one way as text and the other way as files:
    // "..././b.db" sorts before ".../a.db".
    let a_plain = connect(format!("sqlite://{}", a.display())).await;
    let b_plain = connect(format!("sqlite://{}", b.display())).await;
    let a_dotted = connect(format!("sqlite://{}/./a.db", dir.path().display())).await;
    let b_dotted = connect(format!("sqlite://{}/./b.db", dir.path().display())).await;
    let first = fenced::MultiLock::new([a_plain.mutex("x").unwrap(), b_plain.mutex("x").unwrap()]);
    let second =
        fenced::MultiLock::new([b_dotted.mutex("x").unwrap(), a_plain.mutex("x").unwrap()]);
    let third =
        fenced::MultiLock::new([a_dotted.mutex("x").unwrap(), b_dotted.mutex("x").unwrap()]);
    let files = |m: &fenced::MultiLock| -> Vec<String> {
        m.locks()
            .iter()
            .map(|l| {
                let url = l.client().url().trim_start_matches("sqlite://").to_owned();
                std::fs::canonicalize(url).unwrap().display().to_string()
            })
            .collect()
    };
    assert_eq!(files(&first), files(&second));
    assert_eq!(files(&first), files(&third));
}
