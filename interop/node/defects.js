'use strict';
// Defects switched on by hand, so that condmsg's tests can check that `condmsg conformance`
// catches a receiver that breaks the protocol: `node receiver.js --defect NAME` breaks one
// rule, `--list-defects` prints the names. The receiver marks each one with `broken(NAME)`
// at the one place it breaks; without `--defect` every switch is off and the receiver is
// the honest reference. The names are shared with condmsg's own receivers (docs/conformance.md).
const DEFECTS = {
  'refuse-wrong-recipient': 'moves a copy for another recipient to the invalid-message queue',
  'ignore-fail-once': 'lets the app commit on the first attempt of a conformance:fail-once message',
  'ack-duplicates': 'sends a COMMIT ack for a duplicate and for a discarded original',
  'ack-per-part': 'sends a COMMIT ack for every part of a sequence',
  'ack-second-transaction': "commits the COMMIT ack in a transaction of its own, after the app's",
  'no-header-validation': 'checks no header rule (version, kind, instants, lengths, reply_to, sequence bounds, requires)',
  'no-retry-pause': 'returns a failed message to its queue at once',
  'no-original-queue-header': 'moves messages to the invalid-message queue without condmsg-original-queue',
  'wrong-sequence-id': "hands a sequence's whole over with part 0's message id instead of the sequence id",
  'read-mode': 'acks the broker before the app has the message, and sends READ acks',
  'no-verify': 'checks no token',
  'no-cancel-out': 'delivers an original whose compensation came first',
  'deliver-duplicates': 'delivers a redelivered original again',
  'no-invalid-queue': 'drops invalid messages instead of moving them',
  'never-give-up': 'retries a failing message forever',
  'no-sequence-timeout': 'keeps incomplete sequences forever',
  'ack-before-commit': 'acks the delivery to the broker before the commit',
  'wrong-ack-recipient': 'puts another recipient than its own in its acks',
  'no-compensation': 'never hands a compensation to the app',
  'drop-trace-context': 'sends its acks without the trace context of the copies they answer',
};

let on = null; // the defect of this process, if any

/** Reads the command line: nothing, `--defect NAME` or `--list-defects`; anything else is
 * a usage error (exit 2), so that a typo never runs the honest receiver in place of a
 * broken one. */
function fromArgs(args) {
  if (args.length === 1 && args[0] === '--list-defects') {
    process.stdout.write(`${Object.keys(DEFECTS).join('\n')}\n`);
    process.exit(0);
  }
  if (args.length === 2 && args[0] === '--defect' && args[1] in DEFECTS) {
    on = args[1];
    console.error(`receiver: defect ${on} is on: it ${DEFECTS[on]}`);
  } else if (args.length !== 0) {
    const known = Object.keys(DEFECTS).join(', ');
    process.stderr.write(`usage: node receiver.js [--defect NAME | --list-defects]; defects: ${known}\n`);
    process.exit(2);
  }
}

/** Whether the defect `name` is switched on for this process. */
function broken(name) {
  if (!(name in DEFECTS)) throw new Error(`no defect named ${name}`);
  return on === name;
}

module.exports = { broken, fromArgs };
