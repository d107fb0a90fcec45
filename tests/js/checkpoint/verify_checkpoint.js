// Verifies checkpoints with Sigstore's verifier (@sigstore/verify, tlog/checkpoint): its
// signed-note parser and Ed25519 check, with the log's key given as Sigstore gives a
// transparency log's: the key id (here the C2SP key id of the vkey) and the public key.
//
// stdin: {"vkey": "<name>+<hex>+<base64>", "notes": ["<base64>", ...]}; stdout: one JSON line: [{"ok": true, "origin", "size", "root"} | {"ok": false, "error"}, ...]
'use strict';
const crypto = require('node:crypto');
const { verifyCheckpoint } = require('@sigstore/verify/dist/tlog/checkpoint');

const { vkey, notes } = JSON.parse(require('node:fs').readFileSync(0, 'utf-8'));
function splitVkey(text) {
  const first = text.indexOf('+');
  const second = text.indexOf('+', first + 1);
  return [text.slice(0, first), text.slice(first + 1, second), text.slice(second + 1)];
}

const [name, keyId, key] = splitVkey(vkey);
const raw = Buffer.from(key, 'base64');
if (raw[0] !== 0x01 || raw.length !== 33) throw new Error('not an Ed25519 vkey');
// an Ed25519 SubjectPublicKeyInfo is a fixed 12-byte prefix and the 32-byte key
const spki = Buffer.concat([Buffer.from('302a300506032b6570032100', 'hex'), raw.subarray(1)]);
const tlog = {
  logID: Buffer.from(keyId, 'hex'),
  publicKey: crypto.createPublicKey({ key: spki, format: 'der', type: 'spki' }),
  baseURL: name,
  validFor: { start: new Date(0), end: new Date(8.64e15) },
};
const out = notes.map((b64) => {
  const envelope = Buffer.from(b64, 'base64').toString('utf-8');
  try {
    const cp = verifyCheckpoint({ inclusionProof: { checkpoint: { envelope } } }, [tlog]);
    return {
      ok: true,
      origin: cp.origin,
      size: cp.logSize.toString(),
      root: Buffer.from(cp.logHash).toString('hex'),
    };
  } catch (err) {
    return { ok: false, error: String(err.message || err) };
  }
});
process.stdout.write(JSON.stringify(out) + '\n');
