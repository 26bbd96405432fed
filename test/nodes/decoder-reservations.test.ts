// The shared decoder's count of frames on their way to it (Stage.reserve), in its admission's order:
// frames due earlier than the fair window count; within it, frames of cameras decoded less recently
// count (ties by deadline); a frame's own reservation never counts; a release ends one, once.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { FAIR_WINDOW_NS, Reservations } from '../../nodes/decoder.ts';

const W = FAIR_WINDOW_NS;

describe('Reservations', () => {
  test('deadlines apart by more than the fair window: the earlier ones count; each release ends its own, once', () => {
    const r = new Reservations();
    assert.equal(r.ahead(100n * W, 0), 0);
    const release = [30n, 10n, 20n, 20n, 50n].map((d, camera) => r.add(d * 4n * W, camera));
    assert.equal(r.size, 5);
    // asked about by a sixth camera: the reservations due more than W before count
    assert.deepEqual(
      [5n, 10n, 11n, 20n, 21n, 50n, 51n].map((d) => r.ahead(d * 4n * W, 9)),
      [0, 0, 1, 1, 3, 4, 5],
    );
    release[2]!(); // one of the two at 20
    release[2]!(); // again: nothing more
    assert.equal(r.size, 4);
    assert.equal(r.ahead(21n * 4n * W, 9), 2);
    release[3]!();
    release[0]!();
    assert.deepEqual(
      [10n, 11n, 31n, 51n].map((d) => r.ahead(d * 4n * W, 9)),
      [0, 1, 1, 2],
    );
    release[1]!();
    release[4]!();
    assert.equal(r.size, 0);
  });

  test('within the fair window the camera decoded least recently goes first, whatever its stamp', () => {
    const r = new Reservations();
    const t = 1_000_000_000n;
    // Four cameras triggered together, stamped 1 ms apart in camera order.
    for (let camera = 0; camera < 4; camera++) r.add(t + BigInt(camera) * 1_000_000n, camera);
    // None decoded yet: stamp order; a frame's own reservation is not counted.
    assert.deepEqual(
      [0, 1, 2, 3].map((camera) => r.ahead(t + BigInt(camera) * 1_000_000n, camera)),
      [0, 1, 2, 3],
    );
    // Cameras 0 and 1 got their actions (0 first): now 2 and 3 go first, then 0, then 1.
    r.served(0);
    r.served(1);
    assert.deepEqual(
      [0, 1, 2, 3].map((camera) => r.ahead(t + BigInt(camera) * 1_000_000n, camera)),
      [2, 3, 0, 1],
    );
    // A deadline more than the window earlier still goes first, served or not.
    r.add(t - W - 1n, 1);
    assert.equal(r.ahead(t + 2_000_000n, 2), 1);
    // One more than the window later: every reservation counts.
    assert.equal(r.ahead(t + 3_000_000n + W + 1n, 7), 5);
  });
  test('onChange hears each reservation added and each removed once, however often its release is called', () => {
    const heard: [number, number][] = [];
    const r = new Reservations((camera, delta) => heard.push([camera, delta]));
    const first = r.add(1n, 3);
    const second = r.add(2n, 5);
    first();
    first();
    second();
    assert.deepEqual(heard, [
      [3, 1],
      [5, 1],
      [3, -1],
      [5, -1],
    ]);
    assert.equal(r.size, 0);
  });
});
