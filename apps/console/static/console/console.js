// The console's script: small, hand-written, no build step (docs/console.md).
// Pages mark what they need with data- attributes; this file wires them up.
"use strict";
