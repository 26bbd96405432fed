// AbandonableSlot: one uninterruptible run at a time, abandoned (not interrupted) when the caller's
// signal fires. Deterministic: the runs are promises the test settles by hand, no wall time.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AbandonableSlot, abortable } from '../../pipeline/abort.ts';

function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

describe('abortable', () => {
  test('settles with the promise, or rejects with the signal reason as soon as it fires', async () => {
    assert.equal(await abortable(Promise.resolve(3), new AbortController().signal), 3);
    const reason = new Error('why');
    await assert.rejects(abortable(new Promise(() => {}), AbortSignal.abort(reason)), (e) => e === reason);
    const controller = new AbortController();
    const pending = abortable(new Promise(() => {}), controller.signal);
    controller.abort(reason);
    await assert.rejects(pending, (e) => e === reason);
  });
});

describe('AbandonableSlot', () => {
  test('runs start() and resolves with its value', async () => {
    const slot = new AbandonableSlot();
    assert.equal(await slot.run(async () => 'done', new AbortController().signal), 'done');
    assert.equal(slot.busy, false);
    assert.equal(slot.abandoned, 0);
  });

  test('an aborted signal rejects with its reason and starts nothing', async () => {
    const slot = new AbandonableSlot();
    const reason = new Error('deadline');
    let started = false;
    await assert.rejects(
      slot.run(async () => (started = true), AbortSignal.abort(reason)),
      (e) => e === reason,
    );
    assert.equal(started, false);
  });

  test('a signal during the run rejects at once; the run goes on, is counted, and the next waits for it', async () => {
    const slot = new AbandonableSlot();
    const first = deferred<string>();
    const controller = new AbortController();
    const reason = new Error('deadline');
    const pending = slot.run(() => first.promise, controller.signal);
    await turn();
    controller.abort(reason);
    await assert.rejects(pending, (e) => e === reason);
    assert.equal(slot.abandoned, 1);
    assert.equal(slot.busy, true, 'the abandoned run still holds the slot');

    let secondStarted = false;
    const second = slot.run(async () => {
      secondStarted = true;
      return 'second';
    }, new AbortController().signal);
    await turn();
    assert.equal(secondStarted, false, 'no second run while the first is in progress');
    first.resolve('late result, discarded');
    assert.equal(await second, 'second');
    assert.equal(secondStarted, true);
    assert.equal(slot.busy, false);
  });

  test('waiting for an abandoned run can itself be aborted', async () => {
    const slot = new AbandonableSlot();
    const first = deferred<void>();
    const c1 = new AbortController();
    const p1 = slot.run(() => first.promise, c1.signal);
    c1.abort(new Error('one'));
    await assert.rejects(p1, /one/);
    const c2 = new AbortController();
    let started = false;
    const p2 = slot.run(async () => void (started = true), c2.signal);
    await turn();
    c2.abort(new Error('two'));
    await assert.rejects(p2, /two/);
    assert.equal(started, false);
    assert.equal(slot.abandoned, 1, 'only a run that started is counted');
    first.resolve();
    await slot.idle();
    assert.equal(slot.busy, false);
  });

  test("the run's own failure passes through unchanged and frees the slot", async () => {
    const slot = new AbandonableSlot();
    const failure = new Error('encode failed');
    await assert.rejects(
      slot.run(() => Promise.reject(failure), new AbortController().signal),
      (e) => e === failure,
    );
    assert.equal(slot.abandoned, 0);
    await slot.idle();
    assert.equal(await slot.run(async () => 1, new AbortController().signal), 1);
  });
});
