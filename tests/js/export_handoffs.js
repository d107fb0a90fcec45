// Export handoff transitions to `handoffs serve` with the OpenTelemetry JavaScript SDK and
// its OTLP/HTTP exporter (protobuf or JSON, gzip or not), as a Node.js agent would.
//
// Usage: node export_handoffs.js '{"url": "http://127.0.0.1:P/v1/traces", "protocol":
//   "proto" | "json", "compression": "gzip" | "none", "token": "...", "handoffs": N,
//   "prefix": "...", "exports": 1}'
//
// Each handoff is one trace of four spans (create, accept, start, commit), so N handoffs are
// 4N spans, all in one export call; `exports` > 1 sends the very same spans again (a
// transport resend). Prints one JSON line: every export's result code (0 = success) and
// error, and the handoff, trace and span ids it sent.

'use strict';

const { context, trace } = require('@opentelemetry/api');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} = require('@opentelemetry/sdk-trace-base');

const EXPORTERS = {
  proto: () => require('@opentelemetry/exporter-trace-otlp-proto').OTLPTraceExporter,
  json: () => require('@opentelemetry/exporter-trace-otlp-http').OTLPTraceExporter,
};

// [event, from_state, to_state, actor, extra attributes] of one committed handoff
const LIFECYCLE = [
  ['create', '', 'created', 'planner', {
    'handoff.protocol': 'aa-handoff/v1',
    'handoff.mode': 'delegate',
    'handoff.from_agent': 'planner',
    'handoff.to_agent': 'coder',
    'handoff.topology': 'agent_as_tool',
    'handoff.deadline_ms': 60000,
    'handoff.capabilities': ['code.write', 'tests.run'],
  }],
  ['accept', 'created', 'accepted', 'coder', {}],
  ['start', 'accepted', 'running', 'coder', {}],
  ['commit', 'running', 'committed', 'coder', {
    'handoff.evidence.count': 2,
    'handoff.evidence.valid': true,
    'handoff.evidence_refs': ['doc:1', 'test:2'],
    'handoff.receipt.status': 'ok',
    'handoff.receipt.hash': 'sha256:0f',
  }],
];

function nanosToHrTime(ns) {
  return [Number(ns / 1_000_000_000n), Number(ns % 1_000_000_000n)];
}

function buildSpans(opts) {
  const recorder = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': `js-agent-${opts.prefix}` }),
    spanProcessors: [new SimpleSpanProcessor(recorder)],
  });
  const tracer = provider.getTracer('handoffs-js-test', '1.0.0');
  const t0 = BigInt(Date.now()) * 1_000_000n;
  const handoffIds = [];
  for (let i = 0; i < opts.handoffs; i++) {
    const handoffId = `${opts.prefix}-${i}`;
    handoffIds.push(handoffId);
    let parent = context.active();
    LIFECYCLE.forEach(([event, from, to, actor, extra], step) => {
      const start = t0 + BigInt(i) * 1_000_000n + BigInt(step) * 1000n;
      const span = tracer.startSpan(
        `handoff.${event}`,
        {
          startTime: nanosToHrTime(start),
          attributes: {
            'handoff.task_id': `task-${handoffId}`,
            'handoff.handoff_id': handoffId,
            'handoff.event': event,
            'handoff.from_state': from,
            'handoff.to_state': to,
            'handoff.actor': actor,
            'gen_ai.agent.name': actor,
            'gen_ai.operation.name': `handoff.${event}`,
            ...extra,
          },
        },
        parent,
      );
      span.end(nanosToHrTime(start + 500n));
      if (step === 0) parent = trace.setSpan(context.active(), span);
    });
  }
  return { spans: recorder.getFinishedSpans(), handoffIds, provider };
}

function exportOnce(exporter, spans) {
  return new Promise((resolve) => {
    exporter.export(spans, (result) => {
      resolve({ code: result.code, error: result.error ? String(result.error) : null });
    });
  });
}

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const { spans, handoffIds, provider } = buildSpans(opts);
  const Exporter = EXPORTERS[opts.protocol]();
  const exporter = new Exporter({
    url: opts.url,
    headers: { Authorization: `Bearer ${opts.token}` },
    compression: opts.compression,
    timeoutMillis: 30000,
  });
  const results = [];
  for (let n = 0; n < (opts.exports || 1); n++) {
    results.push(await exportOnce(exporter, spans));
  }
  await exporter.shutdown();
  await provider.shutdown();
  process.stdout.write(
    `${JSON.stringify({
      results,
      handoffIds,
      traceIds: [...new Set(spans.map((s) => s.spanContext().traceId))],
      spanIds: spans.map((s) => s.spanContext().spanId),
    })}\n`,
  );
}

main().catch((err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
