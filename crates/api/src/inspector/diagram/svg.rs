//! The diagram drawn as SVG ([`state_diagram`]): a box per state, an arrow per phase, the way to
//! `flagged` from every point, and the same told in words in its `<desc>`.

use maud::{Markup, html};

use super::{KeyPath, Now, Waiting, shape};

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
                @let note = match resumed {
                    0 => String::new(),
                    1 => "resumed here 1 time".to_owned(),
                    n => format!("resumed here {n} times"),
                };
                (node(name, LEFT, y(i), NODE_W, mark, &status, &note))
            }
            @let (mark, status) = if finished {
                (Mark::Now, "▶ now: answer stored")
            } else {
                (Mark::Ahead, "not reached")
            };
            @let waiting = Waiting::of(&key.actions).filter(|_| finished).map(Waiting::words);
            (node("finished", LEFT, finished_y, NODE_W, mark, status, waiting.unwrap_or("")))
            @let (mark, status) = if flagged {
                (Mark::Now, "▶ now: needs a person")
            } else {
                (Mark::Ahead, "not flagged")
            };
            (node("flagged", FLAG_X, flag_y, FLAG_W, mark, status, ""))
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

/// One state's box: its name, its mark in words, and a note (how many attempts resumed there, or
/// what became of a finished key's payment), if any.
fn node(name: &str, x: i32, y: i32, w: i32, mark: Mark, status: &str, note: &str) -> Markup {
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
            @if !note.is_empty() {
                text x=(centre) y=(y + 50) text-anchor="middle" fill="#5b6570" { (note) }
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
    let waiting = Waiting::of(&key.actions).filter(|_| key.now == Now::Finished);
    if let Some(waiting) = waiting {
        text.push_str(
            " Its answer is a payment that requires_action (3-D Secure): the outcome is recorded \
             after the key is finished, by the processor's webhook or the worker's authentication \
             job, and a retry still replays the answer.",
        );
        text.push_str(match waiting {
            Waiting::ForItsCustomer => " No outcome is recorded yet.",
            Waiting::Settled => " The outcome has been recorded (payment.settled).",
        });
    }
    text
}
