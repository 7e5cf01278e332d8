//! The copies' bounds and generations, without a database.

use tokio::sync::{mpsc, oneshot};

use super::*;

/// A reader whose reads each wait for the test to give them a version.
fn reader(begun: mpsc::UnboundedSender<oneshot::Sender<u128>>) -> impl FnOnce() -> Reader {
    move || Reader {
        read: Box::new(move || {
            let begun = begun.clone();
            Box::pin(async move {
                let (answer, version) = oneshot::channel();
                let _ = begun.send(answer);
                version.await.ok().map(|v| (Uuid::from_u128(v), 0))
            })
        }),
        stop: Box::pin(std::future::pending()),
    }
}

fn unused() -> Reader {
    unreachable!("the reader is started by the first request")
}

#[tokio::test]
async fn a_read_that_began_before_a_request_does_not_serve_it_and_the_next_is_shared() {
    let (begun_tx, mut begun) = mpsc::unbounded_channel();
    let fresh = Arc::new(Fresh::default());
    let bound = Duration::from_secs(10);
    let first = tokio::spawn({
        let fresh = fresh.clone();
        async move { fresh.after_now(reader(begun_tx), bound).await }
    });
    let read_1 = begun.recv().await.unwrap();
    // Two requests arrive while the first read runs: it may have read before they arrived.
    let later: Vec<_> = (0..2)
        .map(|_| {
            let fresh = fresh.clone();
            tokio::spawn(async move { fresh.after_now(unused, bound).await })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    read_1.send(1).unwrap();
    assert_eq!(first.await.unwrap(), Some((Uuid::from_u128(1), 0)));
    // One more read serves both.
    let read_2 = begun.recv().await.unwrap();
    read_2.send(2).unwrap();
    for request in later {
        assert_eq!(request.await.unwrap(), Some((Uuid::from_u128(2), 0)));
    }
    tokio::task::yield_now().await;
    assert!(begun.try_recv().is_err(), "a third read began with nobody waiting");
}

#[tokio::test]
async fn a_read_that_failed_or_never_came_serves_nothing() {
    let (begun_tx, mut begun) = mpsc::unbounded_channel();
    let fresh = Arc::new(Fresh::default());
    let waiting = tokio::spawn({
        let fresh = fresh.clone();
        async move { fresh.after_now(reader(begun_tx), Duration::from_secs(10)).await }
    });
    drop(begun.recv().await.unwrap()); // the read fails
    assert_eq!(waiting.await.unwrap(), None);
    let timed_out = fresh.after_now(unused, Duration::from_millis(50)).await;
    assert_eq!(timed_out, None);
}

fn answer(response: &StoredResponse) -> Answer<'_> {
    Answer {
        fingerprint: Fingerprint::from_bytes(&[0; 32]).expect("32 bytes"),
        method: "POST",
        path: "/v1/payments",
        response,
        completed_at_us: 0,
    }
}

#[test]
fn a_packed_answer_gives_back_what_it_was_made_of() {
    let response =
        StoredResponse::json(200, b"xxx".to_vec()).with_header("location", "/v1/payments/pay_1");
    let line = Some(("POST".to_owned(), "/v1/payments".to_owned()));
    let packed = Packed::of(answer(&response)).expect("a small answer packs");
    assert_eq!(packed.response().as_ref(), Some(&response));
    assert_eq!(packed.request_line(), line);
    let bare = StoredResponse { status: 204, headers: vec![], body: vec![] };
    let packed = Packed::of(answer(&bare)).expect("an empty answer packs");
    assert_eq!(packed.response().as_ref(), Some(&bare));
    assert_eq!(packed.request_line(), line);
    // Offsets that do not describe the bytes read as nothing, never as an empty answer.
    let broken = Packed { ends: vec![1, 99, 100].into_boxed_slice(), ..packed };
    assert_eq!(broken.response(), None);
    assert_eq!(broken.request_line(), None);
}

#[test]
fn the_copies_stay_within_their_budget_and_a_copy_used_lately_stays() {
    let answers = ReplayCache::new(64 << 10, Duration::from_secs(3600));
    let response = StoredResponse::json(200, vec![b'x'; 1000]);
    answers.keep("acct_1", "used", answer(&response), 0);
    for n in 0..1000 {
        answers.keep("acct_1", &n.to_string(), answer(&response), 0);
        assert!(answers.get(&name("acct_1", "used")).is_some(), "after {n}");
    }
    let kept = answers.kept.lock().unwrap();
    let bytes: usize =
        kept.current.iter().chain(&kept.previous).map(|(name, answer)| answer.size(name)).sum();
    assert!(bytes <= 64 << 10, "{bytes} bytes kept");
    assert!(!kept.current.contains_key(&name("acct_1", "0")), "the oldest copies go");
    assert!(kept.current.len() + kept.previous.len() >= 30, "most of the budget is used");
}
