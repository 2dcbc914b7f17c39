"""
Every limit and default of the gateway, in one place.

This module imports nothing: configuration, the protocol, the HTTP side, the
command line and the benchmark all read their numbers here, so a number is
written once and a reader finds all of them together.  Times are in seconds
unless a name says otherwise; sizes in bytes.
"""

# -- Where it listens, and what it talks to --------------------------------------------------

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 4444
DEFAULT_OPENCODE_USERNAME = "opencode"
# What computers with the shared password (and everything while auth is off) belong to.
LOCAL_ACCOUNT = "local"

# -- Messages --------------------------------------------------------------------------------

# The largest message a computer may send us, and the largest we send a computer
# (CC:Tweaked's default websocket message limit).
MAX_INBOUND_BYTES = 1024 * 1024
MAX_OUTBOUND_BYTES = 128 * 1024
MAX_ID_LENGTH = 128
MAX_TYPE_LENGTH = 64
MAX_LABEL_LENGTH = 32

# -- Requests to a computer ------------------------------------------------------------------

DEFAULT_REQUEST_TIMEOUT_MS = 600_000
DEFAULT_REQUEST_TIMEOUT = DEFAULT_REQUEST_TIMEOUT_MS / 1000
# A request may wait for a person at its keyboard, not for days.
MAX_REQUEST_TIMEOUT_MS = 24 * 3600 * 1000
MAX_REQUEST_TIMEOUT = MAX_REQUEST_TIMEOUT_MS / 1000
# Requests waiting on one computer: its event queue holds 256 events.
MAX_IN_FLIGHT = 64
# Requests from one computer handled at once; more are refused.
MAX_BUSY = 16
# Requests in flight on one operator WebSocket (``GET /operator``); more are answered 503.
MAX_OPERATOR_IN_FLIGHT = 256
# Operator WebSockets one account's token may hold open at once (SPEC §4).
MAX_OPERATOR_SOCKETS_PER_ACCOUNT = 16
# Watches one account's token holds open at once in this process, of each kind: screen
# and peripheral-event watches (whichever surface: /operator, SSE, a relay from another
# process) and activity watches.  Each is a stream the gateway relays: the bound keeps what
# one account's watchers cost the gateway (and so the other accounts' latency) bounded.
# The admin's are not counted (as its /operator sockets are not).
# (``watch_computers``: one per /operator socket, so MAX_OPERATOR_SOCKETS_PER_ACCOUNT.)
MAX_WATCHES_PER_ACCOUNT = 64
# Bytes written to one HTTP stream (SSE) while its reader takes none, past the transport's own
# buffer (64 KiB): a screen stream sends no frame then (merged until it has room), an event
# stream is ended with a reason past this (``computers.streams``).
MAX_STREAM_HELD_BYTES = 256 * 1024
# A burst of changes to the computers (connects, disconnects, capabilities) is listed
# once to ``watch_computers``, this long after its first change.
LISTING_DEBOUNCE = 0.05
# How long a computer may take to acknowledge a ``cancel``.
CANCEL_TIMEOUT = 10.0

# -- The computer as a sandbox (exec, eval, files, screen) -----------------------------------

# A program or Lua chunk runs this long unless told otherwise, then gets ``terminate``.
DEFAULT_RUN_TIMEOUT_MS = 30_000
# Beyond a run's own timeout, how long the computer has to send its answer.
RUN_ANSWER_MARGIN = 10.0
# Output a run may send back (the computer's own default is 64 KiB).
MAX_OUTPUT_BYTES = 1024 * 1024
# File content in one frame: its base64 keeps the frame under MAX_OUTBOUND_BYTES.
FILE_CHUNK_BYTES = 64 * 1024
# File content in one binary part (``computers.parts``): its header (a path of at most
# MAX_PATH_LENGTH characters, escaped) fits in the rest of the 128 KiB.
BINARY_PART_BYTES = 120 * 1024
# Parts of one read or write in flight at once.
FILE_WINDOW = 6
# Files a snapshot reads or restores at once, and their bytes (one larger goes alone); and the
# bytes of files on their way to one computer from every write at once (``filebudget``), so
# what waits for it stays under what its connection queues (MAX_QUEUED_BYTES).
FILES_AT_ONCE = 32
FILE_BYTES_AT_ONCE = FILE_WINDOW * BINARY_PART_BYTES
# Files in one write_files (a restore's small files, several to a message).
BATCH_FILES = 64
# File content in one call of the HTTP endpoints (split into chunks there).
MAX_FILE_BYTES = 1024 * 1024
# One file, list or screen frame's round trip.
FILE_REQUEST_TIMEOUT = 30.0
# A path on a computer, in characters (``computers.paths``).
MAX_PATH_LENGTH = 1024
# A change of a computer's files waits this long at most for an earlier one of the same
# paths to end (``computers.pathlocks``), then is refused (``overloaded``); and at most so
# many wait for one computer at once (more are refused at once).
PATH_LOCK_WAIT = 120.0
PATH_LOCK_WAITERS = 32
# A screen's size as the gateway relays it (``computers.screen``): CraftOS's largest
# monitor is 164x81 (CraftOS-PC may be set larger): a screen_watch frame claiming more
# than twice that is refused and the watch ended (``too_large``).
MAX_SCREEN_WIDTH = 328
MAX_SCREEN_HEIGHT = 162
# A screen_watch's frames reach its watcher at most this often a second unless its
# maxFps says (SPEC §14: 1..20, default 10), whatever the computer sends.
DEFAULT_SCREEN_FPS = 10
MAX_SCREEN_FPS = 20
# A screen_watch runs until its caller leaves; this bounds a forgotten one.
SCREEN_WATCH_TIMEOUT = 24 * 3600.0
# peripheral_events (SPEC §16): the computer's default and largest timeoutMs; the gateway
# waits this much longer for the answer that ends it.
PERIPHERAL_EVENTS_TIMEOUT_MS = 60_000
MAX_PERIPHERAL_EVENTS_TIMEOUT_MS = 600_000
PERIPHERAL_EVENTS_GRACE = 30.0
# Input events in one request (the computer's M.MAX_INPUT_EVENTS).
MAX_INPUT_EVENTS = 256
# send_input waits this long for the computer to draw what the input did.
SEND_INPUT_SETTLE = 0.3

# -- MCP (the agent's tools) -----------------------------------------------------------------

# One tool call, whole: opencode gives an MCP call about 60 s.  Past it the
# request is cancelled on the computer.
MCP_CALL_TIMEOUT = 50.0
# The longest run a tool asks for, so that the computer stops it and answers
# with its output and timedOut well inside the call's bound.
MCP_MAX_RUN_SECONDS = 45.0
# With progress (SPEC §17: the client gave a progressToken and takes an SSE answer) a run may
# last its own timeoutSeconds up to this, its call that plus the answer's margin.
MCP_PROGRESS_MAX_RUN_SECONDS = 600.0
MCP_CALL_MARGIN = MCP_CALL_TIMEOUT - MCP_MAX_RUN_SECONDS
# Progress goes out at most this often (output heard meanwhile waits for the next tick) ...
MCP_PROGRESS_INTERVAL = 1.0
# ... and at least this often, output or not: every notification resets opencode's clock.
MCP_PROGRESS_HEARTBEAT = 5.0
# The ``timeout`` (ms) of the MCP block the gateway writes for a computer's ask sessions.
# opencode 1.18.33 cuts a tool call at that timeout unless progress resets it
# (NOTES-opencode.md), so it must outlast the longest call the gateway answers without
# progress (MCP_CALL_TIMEOUT) plus the answer's way back, and the longest gap between two
# progress notifications (MCP_PROGRESS_HEARTBEAT): a long run with progress needs no more.
# Set, not left to opencode's default (60 s today), because the block is
# copied from the operator's, whose ``timeout`` may be short (5000 cut calls at 5.5 s: issue
# 26), and a default may change with opencode's version.  An ask's first change also waits
# for the snapshot taken before it (ASK_SNAPSHOT_TIMEOUT at most), sending nothing meanwhile.
# A computer's first snapshot fetches every file: a full 4 MiB disk took about 2 s on the
# harness and a 1.2 MB one 1-2 s on CraftOS-PC; a Minecraft server's tick slows each read.
# A snapshot cut at the bound is not kept, so the next ask would start from nothing again:
# the bound leaves a slow server room to finish the first one.
ASK_SNAPSHOT_TIMEOUT = 20.0
ASK_MCP_TIMEOUT_MS = int((MCP_CALL_TIMEOUT + ASK_SNAPSHOT_TIMEOUT + 10) * 1000)
# opencode's own config (the operator's ``trapsandbox`` MCP block, copied into each asking
# computer's directory) is read again after this long: a new computer's ask does not wait on
# a GET /config of its own.
ASK_CONFIG_TTL = 10.0

# -- Connections -----------------------------------------------------------------------------

HELLO_TIMEOUT = 10.0
# The WebSocket opening handshake (the HTTP upgrade) must complete within this.
OPEN_HANDSHAKE_TIMEOUT = 10.0
# A peer that does not answer our close frame is dropped after this (with a reset, which
# discards what it has not read yet: a computer lagging past it would lose the close's code,
# e.g. 4001's "do not come back", so this leaves room for a Minecraft server's lag spikes).
CLOSE_HANDSHAKE_TIMEOUT = 5.0
# A dead TCP peer is found within a minute and a half; 10,000 idle computers
# then cost about 1 % of a core in pings (measured: 2 % at 30 s).
AUTO_PING_INTERVAL = 60.0
AUTO_PING_TIMEOUT = 30.0
SHUTDOWN_GRACE = 3.0
MAX_CONNECTIONS = 20_000
# All computers of one Minecraft server share its address, and all of them
# connect at once when it starts: the cap is for floods, not for them.
MAX_UNAUTHENTICATED_PER_ADDRESS = 256
# What waits for a computer that stopped reading, and how long it may stall.
MAX_QUEUED_BYTES = 1024 * 1024
STALL_TIMEOUT = 60.0
# "Ignored a bad frame" and "refused a connection" lines: at most one per interval.
LOG_INTERVAL = 10.0
# "Connected" and "disconnected" lines: at most this many a second of each; the
# rest (a fleet reconnecting after a restart) are counted in one line a second.
CONNECT_LINES_PER_SECOND = 20

# -- Guessing secrets and tokens, per address --------------------------------------------------

FREE_FAILURES = 5
BASE_BLOCK = 2.0
MAX_BLOCK = 300.0
FORGET_AFTER = 900.0
MAX_THROTTLED_ADDRESSES = 10_000
# A right guess is admitted even from a throttled address (SPEC §4): a
# SANDBOX_PASSWORD shorter than this is warned about at start.
MIN_PASSWORD_LENGTH = 16

# -- HTTP ------------------------------------------------------------------------------------

# The largest request body kept; a larger one is dropped as it arrives and answered 413.
# (A write-file of MAX_FILE_BYTES is about 1.4 MB of JSON.)
MAX_BODY_BYTES = 2 * 1024 * 1024
# An HTTP connection that sends nothing for this long is closed (Twisted's
# default is 12 hours).  A WebSocket is not affected: once upgraded, it is
# watched by its hello timeout and auto-ping instead.
HTTP_IDLE_TIMEOUT = 30.0
# A request's head and body must arrive whole within this of its first byte
# (a client dripping a byte now and then is not kept): 408, and the connection closed.
REQUEST_DEADLINE = 30.0
# After an idle timeout closes a connection whose client does not read, it is aborted.
HTTP_ABORT_AFTER = 15.0
# HTTP connections from one address whose request has not been admitted yet (no
# operator's token checked, or no head complete); past it, 429 and closed.  Only
# HTTP: computers (``/gateway``) have MAX_UNAUTHENTICATED_PER_ADDRESS.
MAX_UNADMITTED_HTTP_PER_ADDRESS = 256

# -- opencode --------------------------------------------------------------------------------

# The whole probe exchange, headers and body.
PROBE_TIMEOUT = 5.0
# A successful probe is reused this long (a failure never is).
PROBE_FRESH_FOR = 1.0
OPENCODE_CONNECT_TIMEOUT = 5.0

# opencode run by the gateway (OPENCODE_URL unset, ``opencode.managed``): a child that
# ended is started again after a delay doubling from the first to the last, back to the
# first once it stayed up this long; stopping it, SIGKILL follows SIGTERM after the grace
# (opencode 1.18.33 sometimes ignores SIGTERM for seconds while a client holds its stream).
OPENCODE_RESTART_MIN = 1.0
OPENCODE_RESTART_MAX = 30.0
OPENCODE_STABLE_AFTER = 30.0
OPENCODE_STOP_GRACE = 10.0
DEFAULT_OPENCODE_SERVERS = 1
# Past this resident memory, looked at as each ask starts and ends, a server the gateway runs
# is drained and recycled (SANDBOX_OPENCODE_MAX_RSS_MB).  opencode 1.18.33 measured here: ~650
# MiB warm, ~55 MiB more per computer's instance, and it stops answering near 3.2 GiB.  The
# asks already running when it passes the bound finish first (16 at a time, each maybe a new
# instance, its JavaScript heap growing meanwhile): bench.askmanaged at N = 300 saw it peak
# at 3,106 MiB with 2,048, too near the hang, and at 2,848 MiB with 1,536 (19 recycles instead
# of 14, asks per minute ~10 % fewer: docs/benchmarks.md).
OPENCODE_MAX_RSS_MB = 1536
# An ask waits this long for the gateway's own opencode to (re)start; a recycle lets the asks
# running there finish for this long, then ends them ("ask again").
OPENCODE_READY_WAIT = 120.0
# A server it runs is ready once it answers a health call within this (tried again 0.1 s later).
OPENCODE_READY_PROBE = 1.0
# Once it answers, it is ready after what a fresh process's first ask would wait for
# (``Managed.warming``: it loads its model providers, 1.3-1.6 s here), or after this.
OPENCODE_WARM_UP_WAIT = 10.0
OPENCODE_DRAIN_BOUND = 120.0
# A server the gateway runs is started afresh once no ask has run on the gateway for this long
# if it is past this share of its bound: the moment costs nobody anything, its memory goes back,
# and the next new computer finds a fresh process (bench.askmanaged: a new computer's first
# text p50 1.05-1.09 s on a recycled process, 1.68 s on one that made 21 instances, 1.5 GiB).
OPENCODE_QUIET_RECYCLE_AFTER = 300.0
OPENCODE_QUIET_RECYCLE_SHARE = 0.75
# How often a server the gateway runs has its memory looked at while asks run there (besides
# as each ask starts and ends): reading /proc/PID/status, ~20 µs.
OPENCODE_RSS_CHECK_EVERY = 1.0

# -- The process -----------------------------------------------------------------------------

# The cyclic collector's first threshold once start-up is frozen out of it.
GC_THRESHOLD = 20_000

# -- Cluster mode (several processes sharing presence through Redis) ------------------------

# How often each process renews the ownership of its computers, in one batched
# script per CLUSTER_REFRESH_BATCH computers; an owner key lives
# CLUSTER_OWNER_TTL_FACTOR refresh intervals, so a dead process's keys are gone
# within that (its computers are reachable again as soon as they reconnect).
CLUSTER_REFRESH_INTERVAL = 5.0
CLUSTER_OWNER_TTL_FACTOR = 3
CLUSTER_REFRESH_BATCH = 500
# Each process's heartbeat key: written this often (at most), lives three times as long.
CLUSTER_HEARTBEAT_INTERVAL = 2.0
CLUSTER_HEARTBEAT_TTL_FACTOR = 3
# Every Redis call is bounded by this (txredisapi queues commands while Redis is down).
CLUSTER_CALL_TIMEOUT = 2.0
# Reconnecting to Redis: the first retry after this, then backing off to at most this.
CLUSTER_RECONNECT_INITIAL_DELAY = 0.2
CLUSTER_RECONNECT_MAX_DELAY = 2.0
# A request relayed to the process holding the computer waits this much longer
# than its own timeout for that process's answer (which carries the timeout).
CLUSTER_RELAY_MARGIN = 2.0
# While requests are relayed, the requester checks this often that each one's holder
# still listens (its inbox has a subscriber) and Redis still answers: a relay that
# cannot be answered any more is answered 503 then, not at its timeout.
CLUSTER_RELAY_CHECK_INTERVAL = 1.0
# After Redis comes back, the processes write their ownerships again (within one refresh
# interval of their reconnecting): meanwhile a computer nobody holds is looked up again
# this often, so one connected elsewhere is not answered 404 (``Ownership.holder``).
CLUSTER_REBUILD_POLL = 0.25
# /computers asks every other process for its list and waits this long for them.
CLUSTER_LIST_TIMEOUT = 2.0
# Keys and channels start with this.
CLUSTER_PREFIX = "trapsandbox:"

# -- trapsandbox-ctl -------------------------------------------------------------------------

DEFAULT_CTL_URL = "http://127.0.0.1:4444"
CTL_PING_TIMEOUT = 10.0
# Beyond a request's own timeout, how long to wait for the gateway's answer.
CTL_HTTP_MARGIN = 10.0

# -- sandbox ask (the agent in the game) -----------------------------------------------------

# SANDBOX_STATE_DIR: what the gateway keeps on disk (ask directories, snapshots); a relative
# path is taken from the working directory (``make run``: the repository's ./state).
DEFAULT_STATE_DIR = "state"
# SANDBOX_ASK_DIR's default, inside the state directory.
ASK_DIRECTORY_NAME = "ask"
# Ask conversations remembered per account (an opencode session, a scoped MCP token and
# its directory's state per computer); past it the least recently used is forgotten.
MAX_ASK_CONVERSATIONS = 256
# opencode instances (one per asking computer's directory, 2.5-8 MiB each) are given back
# after this long unused (SANDBOX_ASK_INSTANCE_IDLE_MS) ...
ASK_INSTANCE_IDLE = 600.0
# ... and at most this many live at once per opencode server, the least recently used given
# back first (SANDBOX_ASK_MAX_INSTANCES).
ASK_MAX_INSTANCES = 32
# Asks running at once per opencode server and per account (SANDBOX_ASK_MAX_RUNNING,
# SANDBOX_ASK_MAX_RUNNING_PER_ACCOUNT); more wait in order, told how many are ahead.
ASK_MAX_RUNNING = 16
ASK_MAX_RUNNING_PER_ACCOUNT = 4
# A waiting ask is told its place again at least this often, so the computer's idle timer
# (ASK_IDLE_TIMEOUT in libsandbox, 660 s) never ends an ask that is only waiting.
ASK_WAITING_REPEAT = 60.0

# A whole ask, from the prompt to the answer; past it the run is aborted.
ASK_TIMEOUT = 600.0
# One HTTP exchange with opencode for an ask (create a session, send a prompt, abort, reply).
ASK_CALL_TIMEOUT = 30.0
# How long an ask waits for the shared event stream to connect.
ASK_STREAM_READY_TIMEOUT = 10.0
# An opencode server whose event stream has been lost this long and still cannot be opened is
# gone: its running asks end (the stream's retries come 1, 3, 7, 15 s after the loss).
ASK_SERVER_GONE = 10.0
# After an abort, how long the gateway waits for opencode to say the session is idle.
ASK_ABORT_GRACE = 10.0
# The shared /event stream: reconnected after a drop, 1 s doubling to 30 s; opencode sends
# a heartbeat every 10 s, so a stream silent this long is taken as dead.
EVENT_RECONNECT_MIN = 1.0
EVENT_RECONNECT_MAX = 30.0
EVENT_SILENCE_TIMEOUT = 35.0
# One SSE line longer than this is dropped (opencode's events are small).
MAX_EVENT_BYTES = 4 * 1024 * 1024
# Text deltas are coalesced into partials at least this far apart, or this large.
ASK_PARTIAL_INTERVAL = 0.1
ASK_PARTIAL_MAX_CHARS = 4096
# The longest prompt a computer may send.
MAX_PROMPT_CHARS = 16 * 1024
# The shown detail of a permission request (a command line, the first lines of code, a path).
PERMISSION_DETAIL_CHARS = 200
# A question the agent asks the player (opencode's question tool): at most this many
# questions, options each, and characters in one typed answer.
MAX_ASK_QUESTIONS = 8
MAX_ASK_OPTIONS = 16
MAX_ASK_ANSWER_CHARS = 1024
# How long a permission request waits for its tool's input before it shows the pattern.
ASK_PERMISSION_DETAIL_WAIT = 2.0

# -- Snapshots (SPEC §15) --------------------------------------------------------------------

# The defaults of the store's settings (``config``; the store holds the values in force).
# Per computer the newest this many are kept (SANDBOX_SNAPSHOTS_KEEP).
SNAPSHOTS_KEEP = 10
# Per account, what its kept snapshots take, at most (SANDBOX_SNAPSHOT_QUOTA_MB): past it the
# oldest are pruned first.  What they take (``retention``): each snapshot's file list as both
# stores keep it (its JSON, byte for byte) plus SNAPSHOT_LIST_OVERHEAD, and each content hash
# once, its size plus SNAPSHOT_CONTENT_OVERHEAD: a stored list or hash costs something even
# when its files are empty (the key, row and index entries around it; measured in
# docs/operations.md).
SNAPSHOT_QUOTA_BYTES = 64 * 1024 * 1024
SNAPSHOT_LIST_OVERHEAD = 512
SNAPSHOT_CONTENT_OVERHEAD = 512
# A computer whose files add up to more than this (SANDBOX_SNAPSHOT_MAX_MB, counted from the
# listed sizes) is refused, not half-saved; and so many files at most.
SNAPSHOT_MAX_BYTES = 4 * 1024 * 1024
SNAPSHOT_MAX_FILES = 4096
# A snapshot call made while the store still opens (just after start) waits this long for it.
SNAPSHOT_STORE_OPEN_WAIT = 10.0
SNAPSHOT_MAX_PATH_CHARS = 1024
# Content no snapshot uses is removed once nothing touched it for this long, so a snapshot
# being taken (its content checked and uploaded, not committed yet) keeps what it needs.
SNAPSHOT_ORPHAN_GRACE = 600.0
# A modified text file's diff: files larger than this get none (difflib is quadratic),
# and the diff is cut after this many lines.
SNAPSHOT_DIFF_MAX_BYTES = 256 * 1024
SNAPSHOT_DIFF_MAX_LINES = 400
# The embedded store's file in the state directory.
SNAPSHOTS_FILE_NAME = "snapshots.sqlite3"

# A snapshot's listing: the computer answers a few hundred files in a few batches of 64.
SNAPSHOT_LIST_TIMEOUT = 60.0
# trapsandbox-ctl's snapshot, changes and restore: every changed file fetched or written back.
CTL_SNAPSHOT_TIMEOUT = 300.0
