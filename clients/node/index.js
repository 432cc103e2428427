'use strict';
// The npm package "skiplock": the Worker (worker.js) and enqueue (producer.js); see README.md and
// the TypeScript declarations in index.d.ts.
const { Worker, Fail, Snooze, Outcome, Unreachable, Refused, transient, withTrace } = require('./worker');
const { enqueue } = require('./producer');

module.exports = { Worker, Fail, Snooze, Outcome, Unreachable, Refused, transient, withTrace, enqueue };
