// The shared decoder's count of frames on their way to it (Stage.reserve): frames due strictly
// earlier count, a release ends one reservation once, equal deadlines are kept apart.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Reservations } from '../nodes/decoder.ts';

describe('Reservations', () => {
  test('counts the reservations due strictly before a deadline; each release ends its own, once', () => {
    const r = new Reservations();
    assert.equal(r.before(100n), 0);
    const release = [30n, 10n, 20n, 20n, 50n].map((d) => r.add(d));
    assert.equal(r.size, 5);
    assert.deepEqual(
      [5n, 10n, 11n, 20n, 21n, 50n, 51n].map((d) => r.before(d)),
      [0, 0, 1, 1, 3, 4, 5],
    );
    release[2]!(); // one of the two at 20
    release[2]!(); // again: nothing more
    assert.equal(r.size, 4);
    assert.equal(r.before(21n), 2);
    release[3]!();
    release[0]!();
    assert.deepEqual(
      [10n, 11n, 31n, 51n].map((d) => r.before(d)),
      [0, 1, 1, 2],
    );
    release[1]!();
    release[4]!();
    assert.equal(r.size, 0);
  });
});
