//! Step charts of values over time as inline SVG, and HTML escaping: what the pages Joist writes
//! (`joist simulate --html`, `joist bench versus-karpenter --html`) draw their charts with. Drawing
//! cannot fail: an empty series draws an empty chart.

use std::fmt::Write;

use super::report::clock;

/// The chart's size and the room its axes take.
const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 24.0;

/// One line on a chart: its label, its colour, whether it is dashed, and its `(seconds, value)`
/// points, each value holding until the next point.
pub struct Series<'a> {
    /// The legend's text.
    pub label: &'a str,
    /// A CSS colour.
    pub colour: &'a str,
    /// Drawn dashed (to tell two runs apart on one chart).
    pub dashed: bool,
    /// The points, in time order.
    pub points: Vec<(f64, f64)>,
}

/// A chart of `lines` over `duration` seconds with its legend; `counts` keeps the axis to whole
/// numbers; `id` names the SVG element.
pub fn step_chart(page: &mut String, id: &str, counts: bool, lines: &[Series], duration: f64) {
    let top = lines
        .iter()
        .flat_map(|line| line.points.iter().map(|(_, value)| *value))
        .fold(0.0, f64::max);
    let tick = if counts {
        nice_step(top).max(1.0)
    } else {
        nice_step(top)
    };
    let y_max = (top / tick).ceil().max(1.0) * tick;
    let duration = duration.max(1.0);
    let x = |seconds: f64| LEFT + (WIDTH - LEFT - RIGHT) * seconds / duration;
    let y = |value: f64| TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - value / y_max);
    let _ = write!(
        page,
        "<p class=\"legend\">{}</p>\n<svg id=\"chart-{id}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{id} over time\">\n",
        lines
            .iter()
            .map(|line| format!(
                "<i style=\"background:{}\"></i>{}",
                line.colour,
                escape(line.label)
            ))
            .collect::<String>()
    );
    let mut value = 0.0;
    while value <= y_max + tick / 2.0 {
        let _ = writeln!(
            page,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e5e7eb\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            y(value) + 4.0,
            axis_number(value, tick),
            y = y(value),
        );
        value += tick;
    }
    let time_tick = nice_step(duration / 60.0).max(0.5) * 60.0;
    let mut seconds = 0.0;
    while seconds <= duration + 0.5 {
        let _ = writeln!(
            page,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(seconds),
            HEIGHT - 6.0,
            clock(seconds)
        );
        seconds += time_tick;
    }
    for line in lines {
        let mut path = String::new();
        for (i, (at, value)) in line.points.iter().enumerate() {
            let (px, py) = (x(*at), y(*value));
            if i == 0 {
                let _ = write!(path, "M{px:.1} {py:.1}");
            } else {
                let _ = write!(path, "H{px:.1}V{py:.1}");
            }
        }
        if !line.points.is_empty() {
            let _ = write!(path, "H{:.1}", x(duration));
        }
        let dash = if line.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let _ = writeln!(
            page,
            "<path d=\"{path}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash}><title>{}</title></path>",
            line.colour,
            escape(line.label)
        );
    }
    page.push_str("</svg>\n");
}

/// A round step (1, 2 or 5 times a power of ten) that divides `top` into at most five parts.
fn nice_step(top: f64) -> f64 {
    if top <= 0.0 {
        return 1.0;
    }
    let rough = top / 5.0;
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power)
}

fn axis_number(value: f64, tick: f64) -> String {
    if tick >= 1.0 {
        format!("{value:.0}")
    } else {
        let places = (-tick.log10().floor()) as usize;
        format!("{value:.places$}")
    }
}

/// `text` safe inside HTML elements and attribute values.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_steps_are_round_numbers_that_cover_the_top() {
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(4.0), 1.0);
        assert_eq!(nice_step(30.0), 10.0);
        assert_eq!(nice_step(1.53), 0.5);
        assert_eq!(nice_step(100_000.0), 20_000.0);
    }

    #[test]
    fn cluster_text_cannot_break_out_of_the_page() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }
}
