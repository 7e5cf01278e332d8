//! A key's state diagram as inline SVG, drawn on the server: its operation's recovery points in
//! order, then `finished`, and `flagged` (needs a person) beside them; the points this key passed
//! and the edges it took drawn thick and marked "✓ passed", where it stands now framed twice and
//! marked "▶ now" with its lease. Every state is told in words too (text in the boxes, a `<title>`
//! and a `<desc>`), never by colour alone.

use maud::{Markup, html};
use payments_domain::operations::{
    CANCEL_PAYMENT, CAPTURE_PAYMENT, CREATE_ENDPOINT, CREATE_PAYMENT, CREATE_REFUND,
    UPDATE_ENDPOINT, UPDATE_PAYMENT,
};

/// One operation as the diagram draws it. The recovery points are the operation's own
/// (`recovery_points!` in `payments_domain::operations`); a test holds the two
/// together.
#[derive(Debug)]
pub struct Shape {
    /// The operation's stored name (`idempotency_keys.operation`).
    pub operation: &'static str,
    /// Its recovery points in order, `started` first, each with the audit action that the phase
    /// moving a key there records (how a finished key shows it passed the point).
    pub points: &'static [(&'static str, &'static str)],
    /// Its first phase can store an answer at once (a refusal), skipping the later points.
    pub first_phase_may_finish: bool,
    /// Its section of `docs/operations.md`.
    pub guide_anchor: &'static str,
}

/// Every operation that runs under an idempotency key.
pub const SHAPES: &[Shape] = &[
    Shape {
        operation: CREATE_PAYMENT,
        points: &[("started", ""), ("payment_created", "payment.created")],
        first_phase_may_finish: false,
        guide_anchor: "create-a-payment",
    },
    Shape {
        operation: CAPTURE_PAYMENT,
        points: &[("started", ""), ("capture_started", "payment.capture_started")],
        first_phase_may_finish: true,
        guide_anchor: "capture-a-payment",
    },
    Shape {
        operation: CANCEL_PAYMENT,
        points: &[("started", ""), ("cancel_started", "payment.cancel_started")],
        first_phase_may_finish: true,
        guide_anchor: "cancel-a-payment",
    },
    Shape {
        operation: CREATE_REFUND,
        points: &[("started", ""), ("refund_created", "refund.created")],
        first_phase_may_finish: true,
        guide_anchor: "refund-a-payment",
    },
    Shape {
        operation: UPDATE_PAYMENT,
        points: &[("started", "")],
        first_phase_may_finish: true,
        guide_anchor: "the-keys-state-machine",
    },
    Shape {
        operation: CREATE_ENDPOINT,
        points: &[("started", "")],
        first_phase_may_finish: true,
        guide_anchor: "the-keys-state-machine",
    },
    Shape {
        operation: UPDATE_ENDPOINT,
        points: &[("started", "")],
        first_phase_may_finish: true,
        guide_anchor: "the-keys-state-machine",
    },
];

/// The shape of operation `name`, if it is one of ours.
pub fn shape(name: &str) -> Option<&'static Shape> {
    SHAPES.iter().find(|shape| shape.operation == name)
}

/// Where a key stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Now {
    /// At its recovery point, a process holding the lease.
    LeaseHeld,
    /// At its recovery point, the holder's lease run out (it died or stalled).
    LeaseExpired,
    /// Released at its recovery point after a transient failure.
    LeaseFree,
    /// Its answer stored.
    Finished,
    /// Flagged for a person at its recovery point.
    Flagged,
}

impl Now {
    /// The words the diagram and the legend use.
    pub fn words(self) -> &'static str {
        match self {
            Self::LeaseHeld => "lease held (in flight)",
            Self::LeaseExpired => "lease expired",
            Self::LeaseFree => "lease free (released)",
            Self::Finished => "finished (answer stored)",
            Self::Flagged => "flagged (needs a person)",
        }
    }
}

/// What the diagram is drawn from: the key's row, its attempts and its audit records.
#[derive(Debug, Clone)]
pub struct KeyPath<'a> {
    /// The operation's stored name.
    pub operation: &'a str,
    /// The key's `recovery_point`.
    pub recovery_point: &'a str,
    /// Where it stands.
    pub now: Now,
    /// The recovery point each attempt after the claim started from.
    pub resumed_from: Vec<&'a str>,
    /// The actions of the audit records written under the key.
    pub actions: Vec<&'a str>,
}

const LEFT: i32 = 100;
const NODE_W: i32 = 200;
const NODE_H: i32 = 58;
const GAP: i32 = 44;
const TOP: i32 = 12;
const FLAG_X: i32 = LEFT + NODE_W + 70;
const FLAG_W: i32 = 170;
const WIDTH: i32 = FLAG_X + FLAG_W + 12;
const TAKEN: &str = "#0b6bcb";
const UNTAKEN: &str = "#9aa3ad";

/// A box's state on the diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Passed,
    Now,
    Ahead,
}

/// The diagram of `key`.
pub fn state_diagram(key: &KeyPath<'_>) -> Markup {
    let known = shape(key.operation);
    let mut points: Vec<(&str, &str)> = known.map(|s| s.points.to_vec()).unwrap_or_default();
    if points.is_empty() {
        points.push(("started", ""));
    }
    let at_point = !matches!(key.now, Now::Finished);
    if at_point && !points.iter().any(|(name, _)| *name == key.recovery_point) {
        // A name this table does not know (the operation's points changed): drawn, not hidden.
        points.push((key.recovery_point, ""));
    }
    let may_skip = known.is_none_or(|s| s.first_phase_may_finish) && points.len() > 1;
    let evidence = |i: usize, (name, action): (&str, &str)| {
        i == 0
            || (at_point && name == key.recovery_point)
            || key.resumed_from.contains(&name)
            || (!action.is_empty() && key.actions.contains(&action))
    };
    let mut reached =
        points.iter().enumerate().rposition(|(i, p)| evidence(i, *p)).map_or(1, |i| i + 1);
    if key.now == Now::Finished && !may_skip {
        reached = points.len();
    }
    let finished = key.now == Now::Finished;
    let flagged = key.now == Now::Flagged;
    let stands_at = reached - 1; // the last point reached, where an unfinished key stands
    let y = |i: usize| TOP + i as i32 * (NODE_H + GAP);
    let finished_y = y(points.len());
    let flag_y = (y(0) + y(points.len() - 1)) / 2;
    let height = finished_y + NODE_H + TOP;
    let centre_x = LEFT + NODE_W / 2;
    let title = format!("State diagram of this {} key", key.operation);
    let desc = describe(key, &points, reached, may_skip);
    html! {
        svg #key-diagram xmlns="http://www.w3.org/2000/svg" role="img" width=(WIDTH) height=(height)
            viewBox={ "0 0 " (WIDTH) " " (height) }
            aria-labelledby="key-diagram-title key-diagram-desc"
            font-family="system-ui,sans-serif" font-size="12" {
            title #key-diagram-title { (title) }
            desc #key-diagram-desc { (desc) }
            defs {
                @for (id, colour) in [("arrow-taken", TAKEN), ("arrow", UNTAKEN)] {
                    marker id=(id) viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9"
                        markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse" {
                        path d="M0,0 L10,5 L0,10 z" fill=(colour) {}
                    }
                }
            }
            // Phase k moves a key from point k-1 to point k (the last one to `finished`).
            @for i in 0..points.len() {
                @let taken = if i + 1 < points.len() {
                    i + 1 < reached
                } else {
                    finished && reached == points.len()
                };
                (edge(
                    (centre_x, y(i) + NODE_H), (centre_x, y(i + 1) - 6),
                    taken, &format!("phase {}", i + 1), (centre_x + 8, y(i) + NODE_H + GAP / 2 + 4),
                ))
            }
            @if may_skip {
                @let taken = finished && reached == 1;
                @let (top, bottom) = (y(0) + NODE_H / 2, finished_y + NODE_H / 2);
                @let (bend, end) = (LEFT - 50, LEFT - 6);
                @let d = format!("M{LEFT},{top} C{bend},{top} {bend},{bottom} {end},{bottom}");
                g #refusal { (arrow(&d, taken)) }
                text x="2" y=((top + bottom) / 2) fill="#1d232b" { "phase 1:" }
                text x="2" y=((top + bottom) / 2 + 14) fill="#1d232b" { "refused" }
            }
            @for i in 0..points.len() {
                @let taken = flagged && i == stands_at;
                (edge(
                    (LEFT + NODE_W, y(i) + NODE_H / 2), (FLAG_X, flag_y + NODE_H / 2),
                    taken, "", (0, 0),
                ))
            }
            @for (i, (name, _)) in points.iter().enumerate() {
                @let mark = if at_point && i == stands_at && !flagged { Mark::Now }
                    else if i < reached { Mark::Passed } else { Mark::Ahead };
                @let status = match mark {
                    Mark::Now => format!("▶ now: {}", key.now.words()),
                    Mark::Passed if flagged && i == stands_at => {
                        "✓ passed; stopped here".to_owned()
                    }
                    Mark::Passed => "✓ passed".to_owned(),
                    Mark::Ahead => "not reached".to_owned(),
                };
                @let resumed = key.resumed_from.iter().filter(|p| **p == *name).count();
                (node(name, LEFT, y(i), NODE_W, mark, &status, resumed))
            }
            @let (mark, status) = if finished {
                (Mark::Now, "▶ now: answer stored")
            } else {
                (Mark::Ahead, "not reached")
            };
            (node("finished", LEFT, finished_y, NODE_W, mark, status, 0))
            @let (mark, status) = if flagged {
                (Mark::Now, "▶ now: needs a person")
            } else {
                (Mark::Ahead, "not flagged")
            };
            (node("flagged", FLAG_X, flag_y, FLAG_W, mark, status, 0))
        }
    }
}

/// An arrow from `from` to `to`, thick and solid if this key took it.
fn edge(from: (i32, i32), to: (i32, i32), taken: bool, label: &str, at: (i32, i32)) -> Markup {
    html! {
        (arrow(&format!("M{},{} L{},{}", from.0, from.1, to.0, to.1), taken))
        @if !label.is_empty() { text x=(at.0) y=(at.1) fill="#5b6570" { (label) } }
    }
}

/// The line `d` with an arrowhead at its end.
fn arrow(d: &str, taken: bool) -> Markup {
    let (colour, width, dashes, head) =
        if taken { (TAKEN, 3, "none", "arrow-taken") } else { (UNTAKEN, 1, "5 4", "arrow") };
    html! {
        path class={ "edge" @if taken { " taken" } } fill="none" d=(d) stroke=(colour)
            stroke-width=(width) stroke-dasharray=(dashes) marker-end={ "url(#" (head) ")" } {}
    }
}

/// One state's box: its name, its mark in words, and how many attempts resumed there.
fn node(name: &str, x: i32, y: i32, w: i32, mark: Mark, status: &str, resumed: usize) -> Markup {
    let (class, fill, stroke, width) = match mark {
        Mark::Now => ("node now", "#fff4ce", "#8a5a00", 3),
        Mark::Passed => ("node passed", "#e8f1fb", TAKEN, 2),
        Mark::Ahead => ("node ahead", "#ffffff", UNTAKEN, 1),
    };
    let centre = x + w / 2;
    html! {
        g class=(class) data-state=(name) {
            @if mark == Mark::Now {
                rect x=(x - 5) y=(y - 5) width=(w + 10) height=(NODE_H + 10) rx="9" fill="none"
                    stroke=(stroke) stroke-width="1.5" {}
            }
            rect x=(x) y=(y) width=(w) height=(NODE_H) rx="6" fill=(fill) stroke=(stroke)
                stroke-width=(width)
                stroke-dasharray=(if mark == Mark::Ahead { "4 3" } else { "none" }) {}
            text x=(centre) y=(y + 19) text-anchor="middle" font-family="ui-monospace,monospace"
                font-weight="600" fill="#1d232b" { (name) }
            text x=(centre) y=(y + 35) text-anchor="middle" fill="#1d232b" { (status) }
            @if resumed > 0 {
                text x=(centre) y=(y + 50) text-anchor="middle" fill="#5b6570" {
                    "resumed here " (resumed) (if resumed == 1 { " time" } else { " times" })
                }
            }
        }
    }
}

/// The diagram in words, for the `<desc>`.
fn describe(key: &KeyPath<'_>, points: &[(&str, &str)], reached: usize, may_skip: bool) -> String {
    let names: Vec<&str> = points.iter().map(|(name, _)| *name).collect();
    let mut text = format!(
        "The {} operation moves a key through {}, then finished, one phase per arrow{}; a key at \
         any recovery point can be flagged for a person. This key passed {}",
        key.operation,
        names.join(", "),
        if may_skip { " (a refusal in phase 1 goes from started to finished)" } else { "" },
        names[..reached].join(", "),
    );
    match key.now {
        Now::Finished => text.push_str(" and is finished: its answer is stored."),
        Now::Flagged => {
            text.push_str(&format!(
                ", stopped at {} and is flagged for a person.",
                names[reached - 1]
            ));
        }
        now => text.push_str(&format!(
            " and stands at {} with its {}.",
            names[reached - 1],
            now.words()
        )),
    }
    if !key.resumed_from.is_empty() {
        text.push_str(&format!(" {} later attempts resumed it.", key.resumed_from.len()));
    }
    text
}

#[cfg(test)]
mod tests {
    use idem::RecoveryPoint;
    use payments_domain::operations::{
        CancelPoint, CapturePoint, CreateEndpointPoint, CreatePoint, RefundPoint,
        UpdateEndpointPoint, UpdatePaymentPoint,
    };

    use super::*;

    fn path<'a>(operation: &'a str, point: &'a str, now: Now) -> KeyPath<'a> {
        KeyPath {
            operation,
            recovery_point: point,
            now,
            resumed_from: Vec::new(),
            actions: Vec::new(),
        }
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
}
