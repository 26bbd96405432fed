// The typed wrapper of percept_dds.node (native/dds/src/dds.cc): a Cyclone DDS participant that writes and
// reads serialized samples, with ROS 2's naming (rt/ topics, pkg::msg::dds_::Type_ types) and QoS profiles.
// The addon is built on first use, only where Cyclone DDS is installed. Design: native/dds/README.md
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');
const BUILD_DIR = join(ROOT, 'build', 'dds');
/** Where the addon is built, on first use. */
export const DDS_ADDON_PATH = join(BUILD_DIR, 'Release', 'percept_dds.node');
/** What a build needs of the system: Debian's cyclonedds-dev ships both. */
const CYCLONE_FILES = ['/usr/include/dds/dds.h'];

/** A DDS QoS as ROS 2 states it: keep-last `depth`, volatile; reliable or best effort. */
export interface DdsQos {
  readonly reliable: boolean;
  readonly depth: number;
  /** How long one reliable write may wait for readers' acknowledgements, on the addon's thread (default 100). */
  readonly maxBlockingMs?: number;
}

/** ROS 2's default profile, rmw_qos_profile_default (rmw/include/rmw/qos_profiles.h): reliable, volatile, keep last 10. */
export const ROS2_DEFAULT_QOS: DdsQos = { reliable: true, depth: 10 };
/** ROS 2's sensor data profile, rmw_qos_profile_sensor_data (same file): best effort, volatile, keep last 5. */
export const ROS2_SENSOR_QOS: DdsQos = { reliable: false, depth: 5 };

/** The DDS topic of a ROS 2 topic: `rt` + the name, as rmw_cyclonedds' make_fqtopic with ROS_TOPIC_PREFIX (rmw_node.cpp). */
export function ros2TopicName(name: string): string {
  if (!/^\/[A-Za-z_][A-Za-z0-9_]*(\/[A-Za-z_][A-Za-z0-9_]*)*$/.test(name))
    throw new TypeError(`ros2: expected an absolute ROS 2 topic name such as /percept/actions but received ${JSON.stringify(name)}`);
  return `rt${name}`;
}

/** The DDS type of a ROS 2 message: pkg/msg/Type → pkg::msg::dds_::Type_, as rosidl_typesupport_introspection names it
 * (rmw_cyclonedds' create_type_name in serdata.cpp). */
export function ros2TypeName(type: string): string {
  const m = /^([a-z][a-z0-9_]*)\/msg\/([A-Z][A-Za-z0-9]*)$/.exec(type);
  if (!m) throw new TypeError(`ros2: expected a message type such as std_msgs/msg/String but received ${JSON.stringify(type)}`);
  return `${m[1]}::msg::dds_::${m[2]}_`;
}

/** Cyclone DDS's configuration for percept's default: the loopback interface only, unicast discovery to
 * 127.0.0.1 (loopback has no multicast), participant indices so peers find each other's ports. */
export const LOOPBACK_CYCLONE_CONFIG =
  '<CycloneDDS><Domain Id="any">' +
  '<General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces><AllowMulticast>false</AllowMulticast></General>' +
  '<Discovery><ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>32</MaxAutoParticipantIndex>' +
  '<Peers><Peer Address="127.0.0.1"/></Peers></Discovery>' +
  '</Domain></CycloneDDS>';

interface NativeParticipant {
  createWriter(topic: string, type: string, qos: DdsQos): number;
  createReader(topic: string, type: string, qos: DdsQos, onData: () => void): number;
  write(writer: number, bytes: Uint8Array): boolean;
  writerStats(writer: number): DdsWriterStats;
  matched(entity: number): number;
  take(reader: number, max: number): Buffer[];
  lost(reader: number): { lost: number; rejected: number; overwritten: number };
  drain(timeoutMs: number): Promise<boolean>;
  close(): void;
}
interface DdsAddon {
  Participant: new (domainId: number, config: string, queueCapacity: number) => NativeParticipant;
}

export interface DdsWriterStats {
  /** Samples handed to DDS. */
  readonly written: number;
  /** Samples DDS refused (lastError says why), such as a reliable write that waited past maxBlockingMs. */
  readonly failed: number;
  /** Samples dropped from the full write queue, oldest first, or left in it at close. */
  readonly dropped: number;
  readonly queued: number;
  readonly lastError: string | null;
}

export interface DdsParticipantOptions {
  /** The DDS domain, as ROS_DOMAIN_ID (0–232). */
  readonly domainId: number;
  /** Cyclone DDS XML (or a file:// URI) for this domain. '' (default): CYCLONEDDS_URI when set, else loopback only. */
  readonly config?: string;
  /** Samples waiting for the writer thread, all writers together; past it the oldest is dropped (default 1024). */
  readonly queueCapacity?: number;
}

export interface DdsWriter {
  readonly topic: string;
  /** Queues one serialized sample (its 4-byte encapsulation header first). Never blocks; false when an older sample was dropped. */
  write(cdr: Uint8Array): boolean;
  stats(): DdsWriterStats;
  /** Readers matched now. */
  matched(): number;
}

export interface DdsReader {
  readonly topic: string;
  /** The samples waiting, at most `max`, each serialized with its encapsulation header. */
  take(max?: number): Buffer[];
  /** Writers matched now. */
  matched(): number;
  /** In total: samples DDS itself lost (a gap in a best-effort stream) or rejected (resource limits), and samples a
   * newer one pushed out of the keep-last history before they were taken. */
  lost(): { readonly lost: number; readonly rejected: number; readonly overwritten: number };
}

/** One DDS participant of one domain, with its writers and readers. */
export class DdsParticipant {
  readonly domainId: number;
  /** Where its configuration came from: 'loopback', 'CYCLONEDDS_URI' or 'config'. */
  readonly configFrom: 'loopback' | 'CYCLONEDDS_URI' | 'config';
  readonly #native: NativeParticipant;
  #closed = false;

  private constructor(native: NativeParticipant, domainId: number, configFrom: DdsParticipant['configFrom']) {
    this.#native = native;
    this.domainId = domainId;
    this.configFrom = configFrom;
  }

  /** Builds the addon when it is missing (once), then joins the domain. */
  static async open(options: DdsParticipantOptions): Promise<DdsParticipant> {
    const { domainId, config = '', queueCapacity = 1024 } = options;
    if (!Number.isInteger(domainId) || domainId < 0 || domainId > 232)
      throw new RangeError(`ros2: expected domainId an integer 0–232 (as ROS_DOMAIN_ID) but received ${domainId}`);
    if (!Number.isInteger(queueCapacity) || queueCapacity < 1)
      throw new RangeError(`ros2: expected queueCapacity an integer >= 1 but received ${queueCapacity}`);
    const addon = await loadDdsAddon();
    const fromEnv = config === '' && Boolean(process.env.CYCLONEDDS_URI);
    const xml = config !== '' ? config : fromEnv ? '' : LOOPBACK_CYCLONE_CONFIG;
    let native: NativeParticipant;
    try {
      native = new addon.Participant(domainId, xml, queueCapacity);
    } catch (err) {
      // Name where the refused configuration came from, so it can be found and fixed.
      const where =
        config !== ''
          ? `ros2.cyclonedds ${JSON.stringify(config)}`
          : fromEnv
            ? `CYCLONEDDS_URI=${process.env.CYCLONEDDS_URI}`
            : 'the loopback default';
      throw new Error(`ros2: Cyclone DDS refused the domain ${domainId} configuration from ${where} (${(err as Error).message})`, {
        cause: err,
      });
    }
    return new DdsParticipant(native, domainId, config !== '' ? 'config' : fromEnv ? 'CYCLONEDDS_URI' : 'loopback');
  }

  /** A writer of ROS 2 messages of `type` (pkg/msg/Type) on the ROS 2 topic `name` (/a/b). */
  createWriter(name: string, type: string, qos: DdsQos): DdsWriter {
    const native = this.#native;
    checkQos(qos);
    const handle = native.createWriter(ros2TopicName(name), ros2TypeName(type), qos);
    return {
      topic: name,
      write: (cdr) => native.write(handle, padCdr(cdr)),
      stats: () => native.writerStats(handle),
      matched: () => native.matched(handle),
    };
  }

  /** A reader of `type` on `name`; `onData` runs on the event loop when samples wait (take them there). */
  createReader(name: string, type: string, qos: DdsQos, onData: () => void): DdsReader {
    const native = this.#native;
    checkQos(qos);
    const handle = native.createReader(ros2TopicName(name), ros2TypeName(type), qos, onData);
    return {
      topic: name,
      take: (max = 64) => native.take(handle, max),
      matched: () => native.matched(handle),
      lost: () => native.lost(handle),
    };
  }

  /** Waits until every queued sample is written and reliable readers acknowledged them, at most `timeoutMs`.
   * Resolves false when time ran out. Off the event loop. */
  drain(timeoutMs: number): Promise<boolean> {
    if (this.#closed) return Promise.resolve(true);
    return this.#native.drain(timeoutMs);
  }

  /** Deletes the participant and everything in it; what is still queued counts as dropped. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#native.close();
  }
}

/** The sample zero-padded to a multiple of 4 bytes, the pad counted in the encapsulation options' two low bits
 * (DDS-XTypes 1.3, 7.6.3.1.2), as DDSI sends whole 4-byte words. */
export function padCdr(cdr: Uint8Array): Uint8Array {
  if (cdr.length < 4)
    throw new RangeError(`ros2: a serialized sample has a 4-byte encapsulation header, but this one has ${cdr.length} bytes`);
  const pad = (4 - (cdr.length % 4)) % 4;
  if (pad === 0) return cdr;
  const out = new Uint8Array(cdr.length + pad);
  out.set(cdr);
  out[3] = (out[3]! & ~3) | pad;
  return out;
}

function checkQos(qos: DdsQos): void {
  if (!Number.isInteger(qos.depth) || qos.depth < 1) throw new RangeError(`ros2: expected a QoS depth >= 1 but received ${qos.depth}`);
}

let loading: Promise<DdsAddon> | undefined;

/** The addon, built first when missing or older than its source. Fails naming the Debian package when Cyclone DDS is absent. */
export function loadDdsAddon(): Promise<DdsAddon> {
  return (loading ??= (async () => {
    await buildWhenStale();
    const require = createRequire(import.meta.url);
    try {
      return require(DDS_ADDON_PATH) as DdsAddon;
    } catch (err) {
      throw new Error(`ros2: cannot load the DDS addon ${DDS_ADDON_PATH}: ${(err as Error).message}`, { cause: err });
    }
  })().catch((err: unknown) => {
    loading = undefined;
    throw err;
  }));
}

/** The sources' hash, written next to the build: a build of other sources is rebuilt. */
function sourceStamp(): string {
  const hash = createHash('sha256');
  for (const file of ['CMakeLists.txt', join('src', 'dds.cc')]) hash.update(readFileSync(join(HERE, file)));
  return hash.digest('hex').slice(0, 16);
}

/** Whether Cyclone DDS's headers and CMake package are installed. */
export function cycloneInstalled(): boolean {
  if (process.env.CycloneDDS_DIR) return true;
  if (!CYCLONE_FILES.every((f) => existsSync(f))) return false;
  const dirs = ['/usr/lib/x86_64-linux-gnu/cmake/CycloneDDS', '/usr/lib/aarch64-linux-gnu/cmake/CycloneDDS', '/usr/lib/cmake/CycloneDDS'];
  return dirs.some((d) => existsSync(join(d, 'CycloneDDSConfig.cmake')));
}

async function buildWhenStale(): Promise<void> {
  const stampFile = join(BUILD_DIR, '.percept-dds-stamp');
  const stamp = sourceStamp();
  if (existsSync(DDS_ADDON_PATH) && existsSync(stampFile) && readFileSync(stampFile, 'utf8') === stamp) return;
  if (!cycloneInstalled())
    throw new Error(
      'ros2: Cyclone DDS is not installed (no /usr/include/dds/dds.h or CycloneDDSConfig.cmake); ' +
        "install Debian's cyclonedds-dev (apt-get install cyclonedds-dev), or set CycloneDDS_DIR to its CMake package",
    );
  const require = createRequire(join(ROOT, 'package.json'));
  const cmakeJs = join(dirname(require.resolve('cmake-js/package.json')), 'bin', 'cmake-js');
  process.stderr.write(`percept: building the DDS addon into ${BUILD_DIR} (once)\n`);
  const args = [cmakeJs, 'compile', '--directory', HERE, '--out', BUILD_DIR, '--config', 'Release', '--parallel', String(cpus().length)];
  await new Promise<void>((resolveBuild, reject) => {
    execFile(process.execPath, args, { cwd: ROOT, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`ros2: building the DDS addon failed: ${`${stdout}${stderr}`.slice(-4000)}`));
      else resolveBuild();
    });
  });
  writeFileSync(stampFile, stamp);
}
