//! Tests of the diagram: its table against each operation's own recovery points, and what a
//! released, finished, refused, flagged or unknown key looks like.

use idem::RecoveryPoint;
use payments_domain::operations::{
    CancelPoint, CapturePoint, CreateEndpointPoint, CreatePoint, RefundPoint, UpdateEndpointPoint,
    UpdatePaymentPoint,
};

use super::*;

fn path<'a>(operation: &'a str, point: &'a str, now: Now) -> KeyPath<'a> {
    KeyPath { operation, recovery_point: point, now, resumed_from: Vec::new(), actions: Vec::new() }
}

/// The `<g>` of state `name`, as drawn.
fn node_of(svg: &str, name: &str) -> String {
    let start = svg.find(&format!("data-state=\"{name}\"")).expect("the state is drawn");
    let start = svg[..start].rfind("<g ").expect("its group");
    let end = start + svg[start..].find("</g>").expect("its end");
    svg[start..end].to_owned()
}

#[test]
fn the_table_holds_each_operations_own_recovery_points() {
    fn names<P: RecoveryPoint>(shape: &Shape) -> Vec<Option<&'static str>> {
        shape.points.iter().map(|(name, _)| P::from_name(name).map(P::name)).collect()
    }
    let own = |shape: &Shape| -> Vec<Option<&'static str>> {
        match shape.operation {
            CREATE_PAYMENT => names::<CreatePoint>(shape),
            CAPTURE_PAYMENT => names::<CapturePoint>(shape),
            CANCEL_PAYMENT => names::<CancelPoint>(shape),
            CREATE_REFUND => names::<RefundPoint>(shape),
            UPDATE_PAYMENT => names::<UpdatePaymentPoint>(shape),
            CREATE_ENDPOINT => names::<CreateEndpointPoint>(shape),
            UPDATE_ENDPOINT => names::<UpdateEndpointPoint>(shape),
            other => panic!("{other} is not an operation"),
        }
    };
    for shape in SHAPES {
        let listed: Vec<Option<&str>> = shape.points.iter().map(|(n, _)| Some(*n)).collect();
        assert_eq!(own(shape), listed, "{}", shape.operation);
        assert_eq!(shape.points[0].0, idem::STARTED, "{}", shape.operation);
        // No point of another operation is one of this one's (a point renamed or moved).
        for other in SHAPES {
            for (name, _) in other.points.iter().filter(|(n, _)| *n != idem::STARTED) {
                let ours = shape.points.iter().any(|(n, _)| n == name);
                let accepted = match shape.operation {
                    CREATE_PAYMENT => CreatePoint::from_name(name).is_some(),
                    CAPTURE_PAYMENT => CapturePoint::from_name(name).is_some(),
                    CANCEL_PAYMENT => CancelPoint::from_name(name).is_some(),
                    CREATE_REFUND => RefundPoint::from_name(name).is_some(),
                    UPDATE_PAYMENT => UpdatePaymentPoint::from_name(name).is_some(),
                    CREATE_ENDPOINT => CreateEndpointPoint::from_name(name).is_some(),
                    _ => UpdateEndpointPoint::from_name(name).is_some(),
                };
                assert_eq!(ours, accepted, "{} and {name}", shape.operation);
            }
        }
    }
    let stored: Vec<&str> = SHAPES.iter().map(|s| s.operation).collect();
    for name in [CREATE_PAYMENT, CAPTURE_PAYMENT, CANCEL_PAYMENT, CREATE_REFUND] {
        assert!(stored.contains(&name), "{name} has no shape");
    }
}

#[test]
fn a_released_key_is_marked_at_its_recovery_point_with_its_path_highlighted() {
    let mut key = path(CREATE_PAYMENT, "payment_created", Now::LeaseFree);
    key.resumed_from = vec!["payment_created", "payment_created"];
    let svg = state_diagram(&key).into_string();
    let now = node_of(&svg, "payment_created");
    assert!(now.contains("node now") && now.contains("▶ now: lease free (released)"), "{now}");
    assert!(now.contains("resumed here 2 times"), "{now}");
    assert!(node_of(&svg, "started").contains("node passed"), "{svg}");
    for ahead in ["finished", "flagged"] {
        assert!(node_of(&svg, ahead).contains("node ahead"), "{ahead}: {svg}");
    }
    assert_eq!(svg.matches("node now").count(), 1, "one state is now: {svg}");
    // Phase 1 taken, phase 2 not yet, nor any way to `flagged`.
    assert_eq!(svg.matches("class=\"edge taken\"").count(), 1, "{svg}");
    assert!(svg.contains("<title id=\"key-diagram-title\">"), "{svg}");
    let desc = &svg[svg.find("<desc").unwrap()..svg.find("</desc>").unwrap()];
    assert!(desc.contains("stands at payment_created with its lease free"), "{desc}");
    // A create has no refusal after its claim: no arc from `started` to `finished`.
    assert!(!svg.contains("refused"), "{svg}");
}

#[test]
fn a_finished_key_passed_every_point_it_recorded() {
    let mut key = path(CREATE_PAYMENT, "finished", Now::Finished);
    key.actions = vec!["payment.created", "payment.charged"];
    let svg = state_diagram(&key).into_string();
    assert!(node_of(&svg, "finished").contains("▶ now: answer stored"), "{svg}");
    assert!(node_of(&svg, "payment_created").contains("✓ passed"), "{svg}");
    assert_eq!(svg.matches("class=\"edge taken\"").count(), 2, "both phases: {svg}");
}

#[test]
fn a_finished_create_whose_payment_waits_on_its_customer_says_so_until_its_outcome() {
    let mut key = path(CREATE_PAYMENT, "finished", Now::Finished);
    key.actions = vec!["payment.created", REQUIRES_ACTION];
    let svg = state_diagram(&key).into_string();
    let finished = node_of(&svg, "finished");
    assert!(finished.contains("▶ now: answer stored"), "{finished}");
    assert!(finished.contains(">payment: requires_action</text>"), "{finished}");
    assert_eq!(svg.matches("class=\"edge taken\"").count(), 2, "both phases: {svg}");
    let desc = &svg[svg.find("<desc").unwrap()..svg.find("</desc>").unwrap()];
    assert!(desc.contains("a payment that requires_action"), "{desc}");
    assert!(desc.contains("No outcome is recorded yet."), "{desc}");
    // The webhook or the worker's job recorded the outcome under the same key.
    key.actions.push(SETTLED);
    let svg = state_diagram(&key).into_string();
    let finished = node_of(&svg, "finished");
    assert!(finished.contains(">payment: settled later</text>"), "{finished}");
    assert!(!finished.contains("requires_action"), "{finished}");
    assert!(svg.contains("The outcome has been recorded (payment.settled)."), "{svg}");
    // A payment authorized at once says nothing of the kind.
    key.actions = vec!["payment.created", "payment.charged"];
    let svg = state_diagram(&key).into_string();
    assert!(!svg.contains("payment:") && !svg.contains("requires_action"), "{svg}");
}

#[test]
fn a_refused_capture_goes_from_started_straight_to_finished() {
    let mut key = path(CAPTURE_PAYMENT, "finished", Now::Finished);
    key.actions = vec!["payment.capture_refused"];
    let svg = state_diagram(&key).into_string();
    assert!(node_of(&svg, "capture_started").contains("not reached"), "{svg}");
    assert_eq!(svg.matches("class=\"edge taken\"").count(), 1, "{svg}");
    let arc = &svg[svg.find("<g id=\"refusal\">").expect("the refusal arc is drawn")..];
    assert!(arc.starts_with("<g id=\"refusal\"><path class=\"edge taken\""), "{arc}");
    // With its capture recorded, the same key took both phases instead.
    key.actions = vec!["payment.capture_started", "payment.captured"];
    let svg = state_diagram(&key).into_string();
    assert!(node_of(&svg, "capture_started").contains("✓ passed"), "{svg}");
    assert!(svg.contains("<g id=\"refusal\"><path class=\"edge\""), "{svg}");
    assert_eq!(svg.matches("class=\"edge taken\"").count(), 2, "{svg}");
}

#[test]
fn a_flagged_key_shows_where_it_stopped() {
    let svg = state_diagram(&path(CREATE_REFUND, "refund_created", Now::Flagged)).into_string();
    assert!(node_of(&svg, "flagged").contains("▶ now: needs a person"), "{svg}");
    assert!(node_of(&svg, "refund_created").contains("stopped here"), "{svg}");
    assert!(node_of(&svg, "finished").contains("not reached"), "{svg}");
    // Phase 1, and the way from `refund_created` to `flagged`.
    assert_eq!(svg.matches("class=\"edge taken\"").count(), 2, "{svg}");
}

#[test]
fn a_point_or_operation_the_table_does_not_know_is_drawn_escaped() {
    let hostile = "<script>alert(1)</script>";
    let svg = state_diagram(&path(hostile, hostile, Now::LeaseHeld)).into_string();
    assert!(!svg.contains("<script>"), "{svg}");
    assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{svg}");
    let now = &svg[svg.find("node now").unwrap()..];
    assert!(now.contains("&lt;script&gt;") && now.contains("lease held"), "{svg}");
}
