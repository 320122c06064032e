"""Live text across re-attaches: what a followed stream hands its caller (docs/api.md, "Live text").

The runtime sends the text and thinking of a model call in flight as id-less `text` / `thinking`
frames, then the committed event (with an id) carrying only what the live frames did not show; an
id-less `retry`, `provider_fallback` or `turn_cancelled` frame (named for why the call's attempt
was given up) voids the live frames not yet confirmed. A re-attach (Last-Event-ID) sends
the call's live text again from its start. `LiveText` keeps the caller's view to the rule
"concatenating the `text` events gives the run's text" across re-attaches: it skips what the
caller already has, and yields a `retry` void when what comes back differs from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from loomcycle_http.client.events import Event

KINDS = ("text", "thinking")
VOIDS = ("retry", "provider_fallback", "turn_cancelled")  # id-less: the unconfirmed live text is void
VOID = {"type": "retry", "retry": {"reason": "live_text_discarded", "message": "the re-attached stream differs"}}


@dataclass
class LiveText:
    pending: dict[str, str] = field(default_factory=lambda: dict.fromkeys(KINDS, ""))  # yielded, not confirmed
    replay: dict[str, str] = field(default_factory=lambda: dict.fromkeys(KINDS, ""))  # to skip on this connection

    def reconnected(self) -> None:
        """A new connection: it sends the unconfirmed live text again."""
        self.replay = dict(self.pending)

    def feed(self, event: Event) -> list[Event]:
        """The events to hand the caller for `event`."""
        if event.type in VOIDS and event.seq is None:
            self.pending, self.replay = dict.fromkeys(KINDS, ""), dict.fromkeys(KINDS, "")
            return [event]
        if event.type not in KINDS:
            return [event]
        kind, text, skip = event.type, event.text, self.replay[event.type]
        out: list[Event] = []
        if skip:
            self.replay[kind] = ""
            if skip.startswith(text) and event.seq is None:
                self.replay[kind] = skip[len(text) :]
                return []
            if text.startswith(skip):
                event = Event(kind, {**event.data, "text": text[len(skip) :]}, event.seq)
            else:
                out.append(Event("retry", dict(VOID), None))
                self.pending = dict.fromkeys(KINDS, "")
        if event.seq is None:
            self.pending[kind] += event.text
        else:
            self.pending[kind] = ""
        return [*out, event]
