//! The inspector, end to end: the pages as a real headless browser (Debian's `chromium`) renders
//! them, after a test created the keys they show and the browser logged in through the form. `make
//! test` installs chromium when it is missing and sets PAYMENTS_REQUIRE_BROWSER=1; without a
//! browser and without that variable the browser test says so and passes, so that `cargo test`
//! works on a laptop without one. The login itself (a POST, a strict cookie, limited guesses) is
//! checked without a browser too.

use std::path::PathBuf;
use std::time::Duration;

use payments_tests::{TestApp, spawn_with_sim};
use serde_json::json;
use sqlx::PgPool;

const TOKEN: &str = "operator-token-for-tests-0123";

async fn app(pool: PgPool) -> (TestApp, String) {
    spawn_with_sim(
        pool,
        &[
            ("PAYMENTS__INSPECTOR__ENABLED", "true"),
            ("PAYMENTS__INSPECTOR__TOKEN", TOKEN),
            ("PAYMENTS__PROCESSOR__MAX_RETRIES", "0"),
        ],
    )
    .await
}

/// Chromium or Chrome, if this machine has one.
fn browser() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let names = ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"];
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
            .find(|candidate| candidate.is_file())
    })
}

/// What a fresh headless browser profile writes to its standard output after loading `url`
/// (following redirects and keeping the cookies they set) with `what` (e.g. `--dump-dom`).
/// Asynchronous: the server under test runs on this runtime.
async fn headless(browser: &PathBuf, url: &str, what: &[&str]) -> Vec<u8> {
    let profile = std::env::temp_dir().join(format!("inspector-browser-{}", uuid::Uuid::new_v4()));
    let output = tokio::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=1000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(what)
        .arg(url)
        .kill_on_drop(true)
        .output()
        .await
        .expect("the browser runs");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// The DOM of `url` as the browser built it.
async fn render(browser: &PathBuf, url: &str) -> String {
    String::from_utf8(headless(browser, url, &["--dump-dom"]).await).unwrap()
}

/// A PNG of `url` as the browser draws it, written to `path`.
async fn screenshot(browser: &PathBuf, url: &str, path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    let to = format!("--screenshot={}", path.display());
    headless(browser, url, &["--hide-scrollbars", "--window-size=1280,1400", &to]).await;
}

/// Chromium, or `None` (and the test says it is skipped) when this machine has none and
/// PAYMENTS_REQUIRE_BROWSER is not set.
fn browser_or_skip() -> Option<PathBuf> {
    let found = browser();
    if found.is_none() {
        assert!(
            std::env::var_os("PAYMENTS_REQUIRE_BROWSER").is_none(),
            "no chromium on this machine, and PAYMENTS_REQUIRE_BROWSER is set"
        );
        eprintln!("skipped: no chromium (make test installs it)");
    }
    found
}

/// How many pixels of the PNG at `path` have each of `colours` (RGB), and how many are not white.
fn count_pixels(path: &std::path::Path, colours: &[[u8; 3]]) -> (Vec<usize>, usize) {
    let file = std::fs::File::open(path).expect("the screenshot was written");
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().expect("a bounded image")];
    let frame = reader.next_frame(&mut pixels).expect("its pixels");
    let step = frame.color_type.samples();
    assert!(step >= 3, "a colour screenshot: {:?}", frame.color_type);
    let mut counts = vec![0; colours.len()];
    let mut not_white = 0;
    for pixel in pixels[..frame.buffer_size()].chunks_exact(step) {
        let rgb = [pixel[0], pixel[1], pixel[2]];
        not_white += usize::from(rgb != [255, 255, 255]);
        for (count, colour) in counts.iter_mut().zip(colours) {
            *count += usize::from(rgb == *colour);
        }
    }
    (counts, not_white)
}

/// A page on another port of 127.0.0.1 (the same site as the API, so its strict cookie counts)
/// that posts `token` to the inspector's login form as soon as it loads, sending the browser on
/// to `next` with its session cookie: what an operator typing the token does. Its URL.
async fn logging_in(app: &TestApp, token: &str, next: &str) -> String {
    let page = format!(
        "<!doctype html><form method=\"post\" action=\"{}/inspector/login\">\
         <input name=\"token\" value=\"{token}\"><input name=\"next\" value=\"{next}\"></form>\
         <script>document.forms[0].submit()</script>",
        app.address
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let serve = move || {
        let page = page.clone();
        async move { axum::response::Html(page) }
    };
    let router = axum::Router::new().route("/", axum::routing::get(serve));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// The row id of the key `key`.
async fn key_id(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM idempotency_keys WHERE idempotency_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("the key is stored")
}

fn position(page: &str, needle: &str) -> usize {
    page.find(needle).unwrap_or_else(|| panic!("`{needle}` is not on the page:\n{page}"))
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_browser_sees_the_keys_a_test_created_and_their_phases_in_order(pool: PgPool) {
    let Some(browser) = browser_or_skip() else { return };
    let (app, _sim) = app(pool.clone()).await;
    let (_, secret) = app.create_account("Corner Shop").await;
    let body = json!({"amount": 1250, "currency": "usd", "payment_method": "pm_card_visa"});
    let created = app.post("/v1/payments", &secret, Some("order-7731"), &body).await;
    assert_eq!(created.status(), 201);
    let key_id = key_id(&pool, "order-7731").await;

    let refused = render(&browser, &app.url("/inspector")).await;
    assert!(refused.contains("Operator token required"), "{refused}");
    assert!(!refused.contains("order-7731"), "{refused}");
    let wrong =
        render(&browser, &logging_in(&app, "not-the-token-at-all", "/inspector").await).await;
    assert!(wrong.contains("not the operator token") && !wrong.contains("order-7731"), "{wrong}");
    // A token in the address is not read.
    let in_url = render(&browser, &app.url(&format!("/inspector?token={TOKEN}"))).await;
    assert!(in_url.contains("Operator token required") && !in_url.contains("order-7731"));

    // The posted token becomes a cookie, and the browser follows the redirect with it.
    let overview = render(&browser, &logging_in(&app, TOKEN, "/inspector").await).await;
    assert!(overview.contains("Corner Shop"), "{overview}");
    assert!(overview.contains(&format!("/inspector/keys/{key_id}")), "{overview}");
    assert!(overview.contains("order-7731") && overview.contains("answered 201"), "{overview}");

    let page =
        render(&browser, &logging_in(&app, TOKEN, &format!("/inspector/keys/{key_id}")).await)
            .await;
    let claimed = position(&page, "claimed (attempt 1)");
    let created = position(&page, "payment.created");
    let charged = position(&page, "payment.charged");
    let stored = position(&page, "answer stored: 201");
    assert!(claimed < created && created < charged && charged < stored, "{page}");
    assert!(page.contains("/charge</code>"), "the processor call's derived key: {page}");
    assert!(page.contains("pm_card_…") && !page.contains("pm_card_visa"), "{page}");
    for page in [&overview, &page] {
        assert!(!page.contains(&secret) && !page.contains(TOKEN), "a secret is on the page");
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_browser_draws_the_state_diagram_of_a_key_at_its_recovery_point_and_once_finished(
    pool: PgPool,
) {
    let Some(browser) = browser_or_skip() else { return };
    let (app, sim) = app(pool.clone()).await;
    let (_, secret) = app.create_account("Corner Shop").await;
    let faults = |value: serde_json::Value| {
        let request = app.http.put(format!("{sim}/_sim/faults")).json(&value);
        async move { assert!(request.send().await.unwrap().status().is_success()) }
    };
    let body = json!({"amount": 4200, "currency": "usd", "payment_method": "pm_card_visa"});
    faults(json!({"error_rate": 1.0})).await;
    assert_eq!(app.post("/v1/payments", &secret, Some("drawn"), &body).await.status(), 503);
    let key_id = key_id(&pool, "drawn").await;
    let url = logging_in(&app, TOKEN, &format!("/inspector/keys/{key_id}")).await;
    // The screenshots stay under target/ for a person to look at.
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    // The fills of the box where the key stands now, and of a box it passed (diagram/svg.rs).
    let (now_fill, passed_fill) = ([0xff, 0xf4, 0xce], [0xe8, 0xf1, 0xfb]);

    // Released at `payment_created`: its lease free, phase 2 not reached.
    let waiting = render(&browser, &url).await;
    assert!(waiting.contains("<svg id=\"key-diagram\""), "{waiting}");
    assert!(waiting.contains("<g class=\"node now\" data-state=\"payment_created\">"), "{waiting}");
    assert!(waiting.contains("▶ now: lease free (released)"), "{waiting}");
    assert!(waiting.contains("<g class=\"node ahead\" data-state=\"finished\">"), "{waiting}");
    let shot = shots.join("inspector-key-at-a-recovery-point.png");
    screenshot(&browser, &url, &shot).await;
    let (counts, not_white) = count_pixels(&shot, &[now_fill, passed_fill]);
    // Each box is 200 × 58 pixels, most of it its fill.
    assert!(counts.iter().all(|&n| n > 5_000), "the boxes are drawn: {counts:?}");
    assert!(not_white > 50_000, "the page is drawn: {not_white} pixels not white");

    // The retry resumes it there and finishes it.
    faults(json!({})).await;
    let created = app.post("/v1/payments", &secret, Some("drawn"), &body).await;
    assert_eq!(created.status(), 201);
    let answer = created.text().await.unwrap();
    let finished = render(&browser, &url).await;
    assert!(finished.contains("<g class=\"node now\" data-state=\"finished\">"), "{finished}");
    assert!(finished.contains("<g class=\"node passed\" data-state=\"payment_created\">"));
    assert!(finished.contains("resumed here 1 time"), "{finished}");
    assert_eq!(finished.matches("class=\"node now\"").count(), 1, "{finished}");
    // The stored answer as the client got it, byte for byte, but for the masked token.
    assert!(answer.contains("\"payment_method\":\"pm_card_visa\""), "{answer}");
    let shown = answer.replace("pm_card_visa", "pm_card_…");
    assert!(finished.contains(&format!("<pre id=\"stored-answer\">{shown}</pre>")), "{finished}");
    let shot = shots.join("inspector-finished-key.png");
    screenshot(&browser, &url, &shot).await;
    let (counts, not_white) = count_pixels(&shot, &[now_fill, passed_fill]);
    // Now `finished`, and both points passed.
    assert!(counts[0] > 5_000 && counts[1] > 10_000, "the boxes are drawn: {counts:?}");
    assert!(not_white > 50_000, "the page is drawn: {not_white} pixels not white");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_retry_shows_as_a_second_attempt_and_a_key_in_flight_refreshes(pool: PgPool) {
    let (app, sim) = app(pool.clone()).await;
    let (_, secret) = app.create_account("shop").await;
    let http = reqwest::Client::new();
    let faults = |value: serde_json::Value| {
        let request = http.put(format!("{sim}/_sim/faults")).json(&value);
        async move { assert!(request.send().await.unwrap().status().is_success()) }
    };
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});

    // The processor fails: the key is released at its recovery point; the retry resumes it.
    faults(json!({"error_rate": 1.0})).await;
    assert_eq!(app.post("/v1/payments", &secret, Some("retried"), &body).await.status(), 503);
    faults(json!({})).await;
    assert_eq!(app.post("/v1/payments", &secret, Some("retried"), &body).await.status(), 201);
    let key_id = key_id(&pool, "retried").await;
    let page = |path: String| {
        let request = http.get(app.url(&path)).bearer_auth(TOKEN);
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200);
            response.text().await.unwrap()
        }
    };
    let retried = page(format!("/inspector/keys/{key_id}")).await;
    let second = position(&retried, "attempt 2");
    assert!(position(&retried, "claimed (attempt 1)") < second, "{retried}");
    assert!(retried.contains("resumed a key released after a transient failure"), "{retried}");
    assert!(second < position(&retried, "payment.charged"), "{retried}");
    assert!(!retried.contains("http-equiv=\"refresh\""), "a finished key does not refresh");

    // A slow processor keeps the next key in flight: its page refreshes itself.
    faults(json!({"latency_ms": 3000})).await;
    let slow = {
        let request = app
            .http
            .post(app.url("/v1/payments"))
            .bearer_auth(&secret)
            .header("Idempotency-Key", "slow")
            .json(&body);
        tokio::spawn(request.send())
    };
    let mut in_flight = None;
    for _ in 0..100 {
        if let Some(id) = sqlx::query_scalar::<_, i64>(
            "SELECT id FROM idempotency_keys WHERE idempotency_key = 'slow'",
        )
        .fetch_optional(&pool)
        .await
        .unwrap()
        {
            in_flight = Some(id);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let live = page(format!("/inspector/keys/{}", in_flight.expect("the slow key exists"))).await;
    assert!(live.contains("http-equiv=\"refresh\"") && live.contains("In flight"), "{live}");
    let overview = page("/inspector".to_owned()).await;
    assert!(overview.contains("in flight") && overview.contains("http-equiv=\"refresh\""));
    assert_eq!(slow.await.unwrap().unwrap().status(), 201);

    // Without the token: refused, and nothing about the keys.
    let refused = http.get(app.url("/inspector")).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    assert!(!refused.text().await.unwrap().contains("retried"));
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_inspector_is_off_by_default(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let response = reqwest::get(app.url("/inspector")).await.unwrap();
    assert_eq!(response.status(), 404);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_key_waiting_for_a_person_is_listed_first_and_with_its_account(pool: PgPool) {
    let (app, _sim) = app(pool.clone()).await;
    let (_, secret) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    for key in ["calm", "stuck"] {
        assert_eq!(app.post("/v1/payments", &secret, Some(key), &body).await.status(), 201);
    }
    sqlx::query(
        "UPDATE idempotency_keys SET needs_human_at = now(), last_error = 'gave up after 8 attempts' \
         WHERE idempotency_key = 'stuck'",
    )
    .execute(&pool)
    .await
    .unwrap();

    let overview = app.send(app.http.get(app.url("/inspector")).bearer_auth(TOKEN)).await;
    assert_eq!(overview.status(), 200);
    let overview = overview.text().await.unwrap();
    let (waiting, recent) = overview.split_once("Recent keys by account").unwrap();
    let waiting = &waiting[waiting.find("Waiting for a person").unwrap()..];
    assert!(waiting.contains("stuck") && waiting.contains("gave up after 8 attempts"), "{waiting}");
    assert!(!waiting.contains("calm"), "{waiting}");
    // Both keys, the flagged one too, under their account, newest first.
    let recent = &recent[..recent.find("Jobs staged or dead").unwrap()];
    assert!(position(recent, "shop") < position(recent, "stuck"), "{recent}");
    assert!(position(recent, "stuck") < position(recent, "calm"), "{recent}");
}

/// A POST to the login form, as a browser sends it, without following the answer's redirect.
async fn post_login(app: &TestApp, form: &str, forwarded_for: Option<&str>) -> reqwest::Response {
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build();
    let mut request = http
        .unwrap()
        .post(app.url("/inspector/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form.to_owned());
    if let Some(client) = forwarded_for {
        request = request.header("x-forwarded-for", client);
    }
    app.send(request).await
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_token_is_posted_once_for_a_strict_cookie_and_never_read_from_a_url(pool: PgPool) {
    let (app, _sim) = app(pool).await;
    // A token in the address is not read: the login form, and no cookie.
    let in_url = app.send(app.http.get(app.url(&format!("/inspector?token={TOKEN}")))).await;
    assert_eq!(in_url.status(), 401);
    assert!(in_url.headers().get("set-cookie").is_none());
    let form = in_url.text().await.unwrap();
    assert!(form.contains("<form method=\"post\" action=\"/inspector/login\">"), "{form}");

    // Posted, it opens a session: a cookie that holds no token, HttpOnly, Secure, SameSite=Strict,
    // and the browser is sent back to the page it asked for.
    let form = format!("token={TOKEN}&next=%2Finspector%2Fkeys%2F7");
    let posted = post_login(&app, &form, None).await;
    assert_eq!(posted.status(), 303);
    assert_eq!(posted.headers()["location"], "/inspector/keys/7");
    let cookie = posted.headers()["set-cookie"].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/inspector"] {
        assert!(cookie.split("; ").any(|a| a == attribute), "{attribute} in {cookie}");
    }
    assert!(!cookie.contains(TOKEN), "{cookie}");
    let session = cookie.split(';').next().unwrap().to_owned();
    let page = app.send(app.http.get(app.url("/inspector")).header("cookie", &session)).await;
    assert_eq!(page.status(), 200);
    // A forged session is a wrong credential, and the browser is told to drop it.
    let forged = format!("{}x", &session);
    let refused = app.send(app.http.get(app.url("/inspector")).header("cookie", forged)).await;
    assert_eq!(refused.status(), 401);
    assert!(refused.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));

    // A login never sends the browser off the inspector.
    let form = format!("token={TOKEN}&next=https%3A%2F%2Fevil.example");
    let away = post_login(&app, &form, None).await;
    assert_eq!(away.headers()["location"], "/inspector");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn wrong_tokens_lock_their_source_out_and_the_right_one_waits_too(pool: PgPool) {
    let (app, _sim) = app(pool).await;
    for _ in 0..5 {
        let wrong = post_login(&app, "token=not-the-operator-token", None).await;
        assert_eq!(wrong.status(), 401);
        assert!(wrong.text().await.unwrap().contains("not the operator token"));
    }
    // Locked out: not even the right token is compared, by the form or as a Bearer token.
    let locked = post_login(&app, &format!("token={TOKEN}"), None).await;
    assert_eq!(locked.status(), 429);
    assert!(locked.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert!(locked.headers().get("set-cookie").is_none());
    let bearer = app.send(app.http.get(app.url("/inspector")).bearer_auth(TOKEN)).await;
    assert_eq!(bearer.status(), 429);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn wrong_tokens_from_many_addresses_meet_a_bound_in_all(pool: PgPool) {
    let settings = [
        ("PAYMENTS__INSPECTOR__ENABLED", "true"),
        ("PAYMENTS__INSPECTOR__TOKEN", TOKEN),
        // The tests' connections come from 127.0.0.1: trusted, it names the client.
        ("PAYMENTS__HTTP__TRUSTED_PROXIES", "127.0.0.1"),
    ];
    let (app, _sim) = spawn_with_sim(pool, &settings).await;
    // Each address far below its own bound, all of them together at the bound in all.
    for n in 0..60 {
        let client = format!("198.51.100.{n}");
        let wrong = post_login(&app, "token=not-the-operator-token", Some(&client)).await;
        assert_eq!(wrong.status(), 401, "guess {n}");
    }
    let fresh = post_login(&app, &format!("token={TOKEN}"), Some("203.0.113.1")).await;
    assert_eq!(fresh.status(), 429);
    assert!(fresh.headers().contains_key("retry-after"));
}
