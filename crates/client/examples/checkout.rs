//! A checkout that survives a processor losing half of its answers.
//!
//! With `make run` going (API on 8080, stand-in processor on 12111; `PAYMENTS_API` and `SIM_URL`
//! point it elsewhere):
//!
//! ```sh
//! PAYMENTS_KEY=sk_test_… cargo run -p payments-client --example checkout
//! ```
//!
//! It tells the stand-in to lose 50 % of its answers (the charge happens, the answer never
//! arrives), pays with the client, and shows that one charge was made. Its seed makes the losses
//! the same on every run: the answers to the API's first three charge requests are lost, so the
//! API's own retries, under the payment's downstream key, run out and it answers `503`; the
//! client retries under its Idempotency-Key, and the payment is finished with the charge the
//! first request made. Then it puts the stand-in back as it was.

use payments_client::{Client, NewPayment};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let api = std::env::var("PAYMENTS_API").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let sim = std::env::var("SIM_URL").unwrap_or_else(|_| "http://127.0.0.1:12111".into());
    let key = std::env::var("PAYMENTS_KEY")
        .map_err(|_| "set PAYMENTS_KEY to a secret key (make run prints one)")?;
    let http = reqwest::Client::new();

    let faults: serde_json::Value =
        http.get(format!("{sim}/_sim/faults")).send().await?.json().await?;
    let lossy = serde_json::json!({"seed": 14, "lost_response_rate": 0.5});
    http.put(format!("{sim}/_sim/faults")).json(&lossy).send().await?;
    let before: serde_json::Value =
        http.get(format!("{sim}/_sim/stats")).send().await?.json().await?;

    let client = Client::new(&api, &key)?;
    let mut order = NewPayment::new(4200, "usd", "pm_card_visa");
    order.description = Some("Checkout example".into());
    let outcome = client.create_payment(&order, None).await;

    let after: serde_json::Value =
        http.get(format!("{sim}/_sim/stats")).send().await?.json().await?;
    http.put(format!("{sim}/_sim/faults")).json(&faults).send().await?;

    let payment = outcome?;
    let made = |counter: &str| {
        after[counter].as_u64().unwrap_or(0) - before[counter].as_u64().unwrap_or(0)
    };
    println!("payment {} is {}", payment.value.id, payment.value.status);
    println!("  idempotency key: {}", payment.key);
    println!("  requests made:   {}", payment.attempts);
    println!("  replayed answer: {}", payment.replayed);
    println!("  answers the processor lost: {}", made("faults_injected"));
    println!("  charges made at the processor: {}", made("charges_created"));
    Ok(())
}
