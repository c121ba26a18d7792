// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {MerkleProof} from "./MerkleProof.sol";

/// @title VerificationGame
/// @notice Teutsch-Reitwiessner verification game for ML training. A client escrows a payment for a
///         task; the trainer accepts it with a bond (from then on the client cannot cancel), then
///         commits the Merkle root of its per-step state hashes; any auditor may challenge within a
///         window; each challenge is a game that bisects [lo, hi] down to one step with a chess clock
///         per party, and the task's judge re-runs that step and rules. An auditor that cannot get
///         the transcript may instead demand one piece of a log chunk, which the trainer must post
///         on-chain.
/// @dev    Interface and money rules: docs/contract.md. No owner, no admin function: every role and
///         parameter is fixed at task creation. Pull payments only. Every loop is bounded.
contract VerificationGame {
    /*//////////////////////////////////////////////////////////////
                                 TYPES
    //////////////////////////////////////////////////////////////*/

    enum TaskStatus {
        None,
        Open,
        Accepted,
        Committed,
        Cancelled,
        Finalized
    }

    enum Phase {
        None,
        AwaitingReveal,
        AwaitingResponse,
        Pinned,
        AwaitingData,
        Ended
    }

    enum Outcome {
        None,
        TrainerWon,
        AuditorWon,
        Void,
        Answered
    }

    enum EndReason {
        None,
        Ruling,
        Timeout,
        JudgeTimeout,
        DataProvided
    }

    /// @notice A task; packed so that a bisection move reads one slot of it for the trainer and the
    ///         leaf count, and one for the state root.
    struct Task {
        // slot 0
        address client;
        uint32 clockAllowance;
        uint32 challengeWindow;
        TaskStatus status;
        bool trainerLost;
        bool anyVoid;
        // slot 1
        address trainer;
        uint64 numLeaves; // fixed at creation: the commitment must have exactly this many leaves
        uint32 liveGames;
        // slot 2
        address judge;
        uint32 judgeWindow;
        uint64 windowEnds;
        // slot 3
        uint128 trainerBond;
        uint128 auditorBond;
        // slot 4
        uint128 payment;
        uint32 commitWindow; // seconds the trainer has from its accept to its commit
        uint64 commitBy; // accept time + commitWindow; 0 before the accept
        uint32 auditorWins; // games of the task that ended AuditorWon: they share the reward
        // slots 5-11
        bytes32 specHash;
        bytes32 keyHash; // sha256 of the data key the transcript is sealed under
        bytes32 stateRoot;
        bytes32 logRoot;
        bytes32 transcriptId;
        bytes32 firstLeaf;
        bytes32 lastLeaf;
    }

    /// @notice One challenge as `game(gameId)` returns it (docs/contract.md "Types").
    struct Game {
        uint64 lo;
        uint64 hi;
        uint48 lastMoveAt;
        uint32 trainerClock;
        uint32 auditorClock;
        Phase phase;
        address auditor;
        uint64 taskId;
        bool disputeInit;
        bool availability;
        uint32 piece;
        uint32 windowLeft;
        Outcome outcome;
        EndReason reason;
        bool rewardClaimed;
        bytes32 loLeaf;
        bytes32 hiLeaf;
        bytes32 midLeaf;
    }

    /// @notice A game in storage. Slot 0 holds everything a reveal reads and writes (position, both
    ///         clocks, phase and task), so a bisection move touches as few cold slots as possible.
    struct GameSlots {
        // slot 0
        uint48 lo;
        uint48 hi;
        uint40 lastMoveAt;
        uint32 trainerClock;
        uint32 auditorClock;
        Phase phase;
        uint48 taskId;
        // slot 1
        address auditor;
        bool disputeInit;
        bool availability; // an availability challenge: the trainer must post a piece of log chunk lo
        Outcome outcome;
        EndReason reason;
        bool rewardClaimed; // an AuditorWon game's share of the trainer's bond was credited
        uint32 piece; // availability: the piece of chunk lo demanded (once answered: the piece posted)
        uint24 windowLeft; // availability: seconds of the challenge window left when it was demanded
        // slots 2-4
        bytes32 loLeaf;
        bytes32 hiLeaf;
        bytes32 midLeaf;
    }

    /*//////////////////////////////////////////////////////////////
                                 ERRORS
    //////////////////////////////////////////////////////////////*/

    /// @notice Thrown when a task is created without a payment.
    error ZeroPayment();
    /// @notice Thrown when the trainer or judge is the zero address, or the trainer is its own judge.
    error InvalidRoles(address trainer, address judge);
    /// @notice Thrown when a bond is zero: every false claim must cost its maker something.
    error InvalidBonds(uint128 trainerBond, uint128 auditorBond);
    /// @notice Thrown when a clock, window or the commit window is zero or longer than MAX_DURATION.
    error InvalidDurations(uint32 clockAllowance, uint32 challengeWindow, uint32 judgeWindow, uint32 commitWindow);
    /// @notice Thrown when no task has this id.
    error TaskNotFound(uint256 taskId);
    /// @notice Thrown when no game has this id.
    error GameNotFound(uint256 gameId);
    /// @notice Thrown when the task's status does not allow the call.
    error WrongTaskStatus(uint256 taskId, TaskStatus status);
    /// @notice Thrown when the caller is not the one party allowed to make this call.
    error Unauthorized(address caller, address expected);
    /// @notice Thrown when the task's trainer or judge tries to challenge it.
    error ChallengerNotAllowed(address caller);
    /// @notice Thrown when the value sent is not exactly the bond the task fixed.
    error WrongBond(uint256 sent, uint256 required);
    /// @notice Thrown when a task is created with fewer than 2 leaves (no step to train) or more than MAX_LEAVES.
    error InvalidLeafCount(uint64 numLeaves);
    /// @notice Thrown when a commitment's leaf count is not the one the task fixed at creation.
    error LeafCountMismatch(uint64 expected, uint64 given);
    /// @notice Thrown when a leaf (or a log chunk's leaf) does not verify against its committed root.
    error InvalidProof(uint64 index, bytes32 leaf);
    /// @notice Thrown when a posted piece's hash is not piece `piece` of the chunk's piece tree.
    error InvalidPieceProof(uint64 index, uint32 piece, bytes32 pieceHash);
    /// @notice Thrown when the trainer commits after the commit window it accepted.
    error CommitWindowClosed(uint256 taskId, uint64 commitBy);
    /// @notice Thrown when the client cancels an accepted task while the trainer may still commit.
    error CommitWindowOpen(uint256 taskId, uint64 commitBy);
    /// @notice Thrown when a challenge comes at or after the end of the challenge window.
    error WindowClosed(uint256 taskId, uint64 windowEnds);
    /// @notice Thrown when a task is finalized before its challenge window ends.
    error WindowOpen(uint256 taskId, uint64 windowEnds);
    /// @notice Thrown when a task is finalized while some of its games have not ended.
    error GamesLive(uint256 taskId, uint32 liveGames);
    /// @notice Thrown when an availability challenge names a log chunk the task does not have.
    error DataIndexOutOfRange(uint64 index, uint64 numLeaves);
    /// @notice Thrown when an availability challenge names a piece of a chunk the trainer has already
    ///         posted (`piece` reduced by the chunk's piece count).
    error DataAlreadyProvided(uint256 taskId, uint64 index, uint32 piece);
    /// @notice Thrown when a move, ruling or timeout targets a game that has ended.
    error GameOver(uint256 gameId, Outcome outcome);
    /// @notice Thrown when the game's phase does not accept this move.
    error NotYourTurn(uint256 gameId, Phase phase);
    /// @notice Thrown when a move or ruling comes after its deadline (the mover must be timed out).
    error ClockExpired(uint256 gameId, uint64 deadline);
    /// @notice Thrown when a timeout is claimed at or before the deadline.
    error ClockRunning(uint256 gameId, uint64 deadline);
    /// @notice Thrown when a reward is claimed for a game that did not end AuditorWon.
    error NoReward(uint256 gameId, Outcome outcome);
    /// @notice Thrown when a game's reward is claimed a second time.
    error RewardAlreadyClaimed(uint256 gameId);
    /// @notice Thrown when an account with no credit withdraws.
    error NothingToWithdraw(address account);
    /// @notice Thrown when sending a withdrawal fails (the receiver reverted).
    error TransferFailed(address account, uint256 amount);

    /*//////////////////////////////////////////////////////////////
                                 EVENTS
    //////////////////////////////////////////////////////////////*/

    /// @notice A client created a task and escrowed `payment`.
    event TaskCreated(
        uint256 indexed taskId,
        address indexed trainer,
        address indexed judge,
        address client,
        bytes32 specHash,
        bytes32 keyHash,
        uint64 numLeaves,
        uint128 payment,
        uint128 trainerBond,
        uint128 auditorBond,
        uint32 clockAllowance,
        uint32 challengeWindow,
        uint32 judgeWindow,
        uint32 commitWindow
    );
    /// @notice The trainer accepted the task and posted its bond; it must commit by `commitBy`.
    event TaskAccepted(uint256 indexed taskId, uint64 commitBy);
    /// @notice The client cancelled a task (open, or accepted and not committed in time); the
    ///         payment (and a late trainer's bond) is credited to the client.
    event TaskCancelled(uint256 indexed taskId);
    /// @notice The trainer committed; challenges are accepted until `windowEnds`.
    event Committed(
        uint256 indexed taskId,
        bytes32 stateRoot,
        bytes32 logRoot,
        uint64 numLeaves,
        bytes32 transcriptId,
        bytes32 firstLeaf,
        bytes32 lastLeaf,
        uint64 windowEnds
    );
    /// @notice An auditor opened game `gameId` over `[lo, hi]` (an availability challenge: lo = hi =
    ///         the chunk a piece of which is demanded, followed by DataRequested).
    event Challenged(
        uint256 indexed taskId, uint256 indexed gameId, address indexed auditor, bool disputeInit, uint64 lo, uint64 hi
    );
    /// @notice Game `gameId` demands piece `piece` of log chunk `index` (reduced by the chunk's piece
    ///         count once that is known; else the answer reduces it); the trainer must post it by `deadline`.
    event DataRequested(uint256 indexed gameId, uint256 indexed taskId, uint64 index, uint32 piece, uint64 deadline);
    /// @notice The trainer posted `data`, piece `piece` of log chunk `index`, a chunk of `chunkLength`
    ///         bytes (verified against the piece tree and the log root).
    event DataProvided(
        uint256 indexed gameId, uint256 indexed taskId, uint64 index, uint32 piece, uint64 chunkLength, bytes data
    );
    /// @notice An availability game of task `taskId` ended after the trainer's delay: the challenge
    ///         window now ends at `windowEnds` (see `provideData`).
    event WindowExtended(uint256 indexed taskId, uint64 windowEnds);
    /// @notice The trainer revealed leaf `index`; the auditor's clock runs.
    event LeafRevealed(uint256 indexed gameId, uint64 index, bytes32 leaf, uint32 trainerClockLeft);
    /// @notice The auditor answered; the interval is now `[lo, hi]`.
    event Responded(uint256 indexed gameId, bool agree, uint64 lo, uint64 hi, uint32 auditorClockLeft);
    /// @notice The game is down to step `step`; the judge must rule by `judgeDeadline`.
    event StepPinned(
        uint256 indexed gameId,
        uint256 indexed taskId,
        uint64 step,
        bytes32 preLeaf,
        bytes32 postLeaf,
        uint64 judgeDeadline
    );
    /// @notice The judge posted the post-state hash it computed.
    event Ruled(uint256 indexed gameId, bytes32 computed, bool trainerWon);
    /// @notice A game ended; `winner` is the zero address when nobody was shown wrong (Void, Answered).
    event GameEnded(
        uint256 indexed gameId, uint256 indexed taskId, Outcome outcome, EndReason reason, address winner
    );
    /// @notice A task was settled after its window. When the trainer lost, each of the
    ///         `auditorWins` winning games may claim `rewardShare`, and `burnt` wei are locked for good.
    event TaskFinalized(
        uint256 indexed taskId, bool trainerPaid, uint32 auditorWins, uint128 rewardShare, uint128 burnt
    );
    /// @notice The auditor of game `gameId` was credited its share of the trainer's bond.
    event RewardPaid(uint256 indexed gameId, address indexed auditor, uint256 amount);
    /// @notice `amount` was added to `account`'s withdrawable credit.
    event Credited(address indexed account, uint256 indexed taskId, uint256 amount);
    /// @notice `account` withdrew `amount`.
    event Withdrawn(address indexed account, uint256 amount);

    /*//////////////////////////////////////////////////////////////
                                 STORAGE
    //////////////////////////////////////////////////////////////*/

    /// @notice The longest inclusion proof accepted (a tree of 2^64 leaves is 64 levels deep).
    uint256 public constant MAX_PROOF_LENGTH = MerkleProof.MAX_PROOF_LENGTH;
    /// @notice The most leaves a commitment may have (indices are packed as uint48 in storage).
    uint64 public constant MAX_LEAVES = 2 ** 48;
    /// @notice The longest clock allowance, challenge window, judge window or commit window: a silent
    ///         party can hold a task's money for at most about five such spans (docs/contract.md).
    uint32 public constant MAX_DURATION = 30 days;
    /// @notice The bytes of a log chunk's piece (the last piece may be shorter): an availability
    ///         demand is answered one piece at a time, so one provideData stays under a node's 128 KiB
    ///         transaction limit whatever the chunk's size (game/chunkleaf.py).
    uint256 public constant PIECE_BYTES = 122_880;

    // Bit offsets of GameSlots slot 0 as solc packs it (first member in the lowest bits); reveal
    // reads and writes that slot by hand. tests/contracts check every field through game().
    // lastMoveAt is a uint40 of seconds: good until the year 36812.
    uint256 internal constant HI_SHIFT = 48;
    uint256 internal constant LAST_MOVE_SHIFT = 96;
    uint256 internal constant TRAINER_CLOCK_SHIFT = 136;
    uint256 internal constant PHASE_SHIFT = 200;
    uint256 internal constant TASK_SHIFT = 208;
    uint256 internal constant MASK48 = (1 << 48) - 1;
    /// @dev Slot-0 bits a reveal keeps: lo, hi, the auditor's clock and the task (not lastMoveAt,
    ///      the trainer's clock or the phase, which it rewrites).
    uint256 internal constant REVEAL_KEEP =
        ~((((1 << 40) - 1) << LAST_MOVE_SHIFT) | (((1 << 32) - 1) << TRAINER_CLOCK_SHIFT) | (0xff << PHASE_SHIFT));

    /// @notice The block this contract was deployed in: none of its events lies before it, so an
    ///         event scan (a node's, a block explorer's) starts here instead of at block 0.
    uint256 public immutable deployedInBlock;

    uint256 internal _taskCount;
    uint256 internal _gameCount;
    mapping(uint256 taskId => Task) internal _tasks;
    mapping(uint256 gameId => GameSlots) internal _games;
    mapping(address account => uint256) internal _credit;
    /// @dev Pieces of log chunks a trainer has posted in answer to an availability challenge, per
    ///      task, keyed by `_pieceKey(index, piece)`.
    ///      The value is the time it was posted (0: not posted).
    mapping(uint256 taskId => mapping(uint256 key => uint64)) internal _provided;
    /// @dev A log chunk's piece count, per task, once an answer has shown the chunk's length (0: unknown).
    mapping(uint256 taskId => mapping(uint64 index => uint64)) internal _pieceCount;
    /// @dev Wei locked in this contract for good: the burnt half of forfeited trainer bonds.
    uint256 internal _burnt;

    constructor() {
        deployedInBlock = block.number;
    }

    /*//////////////////////////////////////////////////////////////
                                 TASKS
    //////////////////////////////////////////////////////////////*/

    /// @notice Create a task and escrow `msg.value` as the payment. Roles and parameters are final.
    /// @param specHash Hash of the canonical task config (dataset hash included): the pre-state of step 0.
    /// @param keyHash sha256 of the data key the trainer must seal its transcript under, so that every
    ///        party can check it holds the task's key (the key itself never goes on-chain).
    /// @param trainer The only address that may accept, commit and reveal.
    /// @param judge The only address that may rule pinned steps.
    /// @param numLeaves N, the number of state leaves the trainer must commit (steps + 1, so at least 2):
    ///        fixed here so that a trainer cannot commit fewer steps than the task asks for.
    /// @param trainerBond Exact value the trainer posts when it accepts (at least 1 wei).
    /// @param auditorBond Exact value each auditor posts with a challenge (at least 1 wei).
    /// @param clockAllowance Seconds on each party's chess clock, per game.
    /// @param challengeWindow Seconds after the commit during which challenges are accepted.
    /// @param judgeWindow Seconds the judge has to rule once a step is pinned.
    /// @param commitWindow Seconds the trainer has from its accept to its commit.
    /// @return taskId The new task's id (ids start at 1).
    function createTask(
        bytes32 specHash,
        bytes32 keyHash,
        address trainer,
        address judge,
        uint64 numLeaves,
        uint128 trainerBond,
        uint128 auditorBond,
        uint32 clockAllowance,
        uint32 challengeWindow,
        uint32 judgeWindow,
        uint32 commitWindow
    ) external payable returns (uint256 taskId) {
        // INVARIANT: a task escrows a payment.
        if (msg.value == 0) revert ZeroPayment();
        // INVARIANT: trainer and judge exist and are different parties.
        if (trainer == address(0) || judge == address(0) || trainer == judge) revert InvalidRoles(trainer, judge);
        // INVARIANT: every claim is bonded (a free challenge or commit costs its target, never its maker).
        if (trainerBond == 0 || auditorBond == 0) revert InvalidBonds(trainerBond, auditorBond);
        // INVARIANT: every clock and window is positive and at most MAX_DURATION, so no silent party
        // can hold the money for longer than a few such spans.
        if (
            !_validDuration(clockAllowance) || !_validDuration(challengeWindow) || !_validDuration(judgeWindow)
                || !_validDuration(commitWindow)
        ) revert InvalidDurations(clockAllowance, challengeWindow, judgeWindow, commitWindow);
        // INVARIANT: a task trains at least one step (leaf 0 and leaf 1), and at most MAX_LEAVES leaves.
        if (numLeaves < 2 || numLeaves > MAX_LEAVES) revert InvalidLeafCount(numLeaves);
        taskId = ++_taskCount;
        Task storage t = _tasks[taskId];
        t.client = msg.sender;
        t.clockAllowance = clockAllowance;
        t.challengeWindow = challengeWindow;
        t.status = TaskStatus.Open;
        t.trainer = trainer;
        t.numLeaves = numLeaves;
        t.judge = judge;
        t.judgeWindow = judgeWindow;
        t.trainerBond = trainerBond;
        t.auditorBond = auditorBond;
        // The whole ether supply is far below 2^128 wei, so the cast cannot truncate.
        t.payment = uint128(msg.value);
        t.commitWindow = commitWindow;
        t.specHash = specHash;
        t.keyHash = keyHash;
        _emitCreated(taskId, t);
    }

    /// @notice The trainer locks the task before it trains: it posts its bond, the client can no
    ///         longer cancel, and the trainer must commit within the task's commit window.
    /// @param taskId The open task.
    function accept(uint256 taskId) external payable {
        Task storage t = _task(taskId);
        // INVARIANT: a task is accepted once, and not after a cancel.
        if (t.status != TaskStatus.Open) revert WrongTaskStatus(taskId, t.status);
        // INVARIANT: only the task's trainer accepts.
        if (msg.sender != t.trainer) revert Unauthorized(msg.sender, t.trainer);
        // INVARIANT: the trainer posts exactly its bond.
        if (msg.value != t.trainerBond) revert WrongBond(msg.value, t.trainerBond);
        uint64 commitBy = uint64(block.timestamp) + t.commitWindow;
        t.status = TaskStatus.Accepted;
        t.commitBy = commitBy;
        emit TaskAccepted(taskId, commitBy);
    }

    /// @notice Cancel a task: an open one (the payment is credited back to the client), or an
    ///         accepted one whose trainer did not commit within its commit window (the payment and
    ///         the trainer's bond are credited to the client).
    /// @param taskId The task.
    function cancel(uint256 taskId) external {
        Task storage t = _task(taskId);
        TaskStatus status = t.status;
        // INVARIANT: only a task without a commitment can be cancelled.
        if (status != TaskStatus.Open && status != TaskStatus.Accepted) revert WrongTaskStatus(taskId, status);
        // INVARIANT: only the client cancels.
        if (msg.sender != t.client) revert Unauthorized(msg.sender, t.client);
        uint256 amount = t.payment;
        if (status == TaskStatus.Accepted) {
            // INVARIANT: an accepted task is the trainer's until its commit window has passed.
            // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
            if (block.timestamp <= t.commitBy) revert CommitWindowOpen(taskId, t.commitBy);
            // The trainer broke the promise its bond backed: the client takes the bond.
            amount += t.trainerBond;
        }
        t.status = TaskStatus.Cancelled;
        emit TaskCancelled(taskId);
        _addCredit(t.client, taskId, amount);
    }

    /// @notice The trainer's commitment: roots, leaf count and both end leaves with their proofs.
    /// @dev Verifying leaf 0 and leaf N-1 here fixes the bisection's endpoints for every game.
    /// @param taskId The task.
    /// @param stateRoot Root of the tree of per-step state hashes (leaf i = state after step i).
    /// @param logRoot Root of the tree of rounding-log chunk leaves (leaf i = sha256(uint64 length ||
    ///        piece root) of step i's chunk: see provideData).
    /// @param numLeaves N, the number of state leaves (steps + 1): must be the task's own.
    /// @param transcriptId The sealed transcript's blob id (sha256 of its sealed bytes).
    /// @param firstLeaf Leaf 0, the initial state hash.
    /// @param firstProof Inclusion proof of leaf 0.
    /// @param lastLeaf Leaf N-1, the final state hash.
    /// @param lastProof Inclusion proof of leaf N-1.
    function commit(
        uint256 taskId,
        bytes32 stateRoot,
        bytes32 logRoot,
        uint64 numLeaves,
        bytes32 transcriptId,
        bytes32 firstLeaf,
        bytes32[] calldata firstProof,
        bytes32 lastLeaf,
        bytes32[] calldata lastProof
    ) external {
        Task storage t = _task(taskId);
        // INVARIANT: a task is committed once, after the trainer accepted it (and bonded).
        if (t.status != TaskStatus.Accepted) revert WrongTaskStatus(taskId, t.status);
        // INVARIANT: only the task's trainer commits.
        if (msg.sender != t.trainer) revert Unauthorized(msg.sender, t.trainer);
        // INVARIANT: the commit comes within the commit window the trainer accepted.
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (block.timestamp > t.commitBy) revert CommitWindowClosed(taskId, t.commitBy);
        // INVARIANT: the commitment covers every step the task asks for, no fewer and no more (issue 44:
        // a trainer committing only the initial state, N = 1, was otherwise paid for no training).
        // 2 <= t.numLeaves <= MAX_LEAVES was checked at creation.
        if (numLeaves != t.numLeaves) revert LeafCountMismatch(t.numLeaves, numLeaves);
        // INVARIANT: the initial and final leaves are in the committed tree.
        if (!MerkleProof.verify(stateRoot, 0, numLeaves, firstLeaf, firstProof)) revert InvalidProof(0, firstLeaf);
        if (!MerkleProof.verify(stateRoot, numLeaves - 1, numLeaves, lastLeaf, lastProof)) {
            revert InvalidProof(numLeaves - 1, lastLeaf);
        }
        uint64 windowEnds = uint64(block.timestamp) + t.challengeWindow;
        t.status = TaskStatus.Committed;
        t.windowEnds = windowEnds;
        t.stateRoot = stateRoot;
        t.logRoot = logRoot;
        t.transcriptId = transcriptId;
        t.firstLeaf = firstLeaf;
        t.lastLeaf = lastLeaf;
        emit Committed(taskId, stateRoot, logRoot, numLeaves, transcriptId, firstLeaf, lastLeaf, windowEnds);
    }

    /// @notice Settle a task after its window, once every game has ended (docs/contract.md "Money").
    /// @dev A trainer that lost no game is paid the payment and gets its bond back; a void game (the
    ///      judge silent) shows no fault and does not stop that. A trainer that lost a game forfeits
    ///      its bond: half is burnt, every AuditorWon game may claim an equal share of the other half
    ///      (at most one auditor bond each, `claimReward`), and the rest goes to the client with the
    ///      payment. Settling here, not when a game ends, makes the order of endings irrelevant.
    /// @param taskId The task.
    function finalize(uint256 taskId) external {
        Task storage t = _task(taskId);
        // INVARIANT: only a committed task is settled, and only once.
        if (t.status != TaskStatus.Committed) revert WrongTaskStatus(taskId, t.status);
        // INVARIANT: challenges are accepted until the window ends.
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (block.timestamp < t.windowEnds) revert WindowOpen(taskId, t.windowEnds);
        // INVARIANT: every game has ended.
        if (t.liveGames != 0) revert GamesLive(taskId, t.liveGames);
        t.status = TaskStatus.Finalized;
        if (!t.trainerLost) {
            emit TaskFinalized(taskId, true, 0, 0, 0);
            _addCredit(t.trainer, taskId, uint256(t.payment) + t.trainerBond);
            return;
        }
        (uint128 share, uint128 burn, uint256 toClient) = _forfeit(t);
        _burnt += burn;
        emit TaskFinalized(taskId, false, t.auditorWins, share, burn);
        _addCredit(t.client, taskId, uint256(t.payment) + toClient);
    }

    /*//////////////////////////////////////////////////////////////
                                 GAMES
    //////////////////////////////////////////////////////////////*/

    /// @notice Challenge a commitment by posting the auditor bond; opens a new game.
    /// @param taskId The committed task.
    /// @param disputeInit True to dispute leaf 0 (the initialisation from the spec): pinned at once at
    ///        step 0. False to bisect [0, N-1] with leaf 0 agreed and leaf N-1 disputed.
    /// @return gameId The new game's id (ids start at 1).
    function challenge(uint256 taskId, bool disputeInit) external payable returns (uint256 gameId) {
        Task storage t = _task(taskId);
        _checkChallenger(taskId, t);
        uint64 n = t.numLeaves; // >= 2, checked at creation

        gameId = ++_gameCount;
        ++t.liveGames;
        GameSlots storage g = _games[gameId];
        uint32 clock = t.clockAllowance;
        // lo = hi = 0 for a disputeInit game: the pre-state of step 0 is the spec itself.
        uint48 hi = disputeInit ? 0 : uint48(n - 1);
        bool pinned = disputeInit || n == 2;
        g.lo = 0;
        g.hi = hi;
        g.lastMoveAt = uint40(block.timestamp);
        g.trainerClock = clock;
        g.auditorClock = clock;
        g.phase = pinned ? Phase.Pinned : Phase.AwaitingReveal;
        // taskId <= _taskCount, which cannot reach 2^48 (one transaction per task).
        g.taskId = uint48(taskId);
        g.auditor = msg.sender;
        g.disputeInit = disputeInit;
        bytes32 preLeaf = disputeInit ? t.specHash : t.firstLeaf;
        bytes32 postLeaf = disputeInit ? t.firstLeaf : t.lastLeaf;
        g.loLeaf = preLeaf;
        g.hiLeaf = postLeaf;
        // Pre-fill the reveal slot so that every reveal rewrites a non-zero slot (cheaper).
        g.midLeaf = postLeaf;
        emit Challenged(taskId, gameId, msg.sender, disputeInit, 0, hi);
        if (pinned) emit StepPinned(gameId, taskId, hi, preLeaf, postLeaf, uint64(block.timestamp) + t.judgeWindow);
    }

    /// @notice Availability challenge: demand piece `piece` of log chunk `index` of the committed log
    ///         tree, for an auditor that cannot get or open the transcript. The trainer must post the
    ///         piece with `provideData` within its clock, or it loses the game (and with it the task).
    /// @dev    An auditor that has never seen the chunk cannot know its piece count: any number is
    ///         accepted, and reduced modulo the count once an answer has made it known (here if it
    ///         is known already, else in `provideData`).
    /// @param taskId The committed task.
    /// @param index The step whose rounding-log chunk is demanded (0 to N-1).
    /// @param piece The piece of the chunk demanded (PIECE_BYTES each; reduced modulo their count).
    /// @return gameId The new game's id.
    function challengeData(uint256 taskId, uint64 index, uint32 piece) external payable returns (uint256 gameId) {
        Task storage t = _task(taskId);
        _checkChallenger(taskId, t);
        // INVARIANT: the chunk demanded is a leaf of the log tree.
        if (index >= t.numLeaves) revert DataIndexOutOfRange(index, t.numLeaves);
        piece = _reduced(taskId, index, piece);
        // INVARIANT: a piece posted once is public for good; nobody can make the trainer post it again.
        if (_provided[taskId][_pieceKey(index, piece)] != 0) revert DataAlreadyProvided(taskId, index, piece);

        gameId = ++_gameCount;
        ++t.liveGames;
        GameSlots storage g = _games[gameId];
        uint32 clock = t.clockAllowance;
        // index < numLeaves <= 2^48, so it fits the uint48 position fields.
        g.lo = uint48(index);
        g.hi = uint48(index);
        g.lastMoveAt = uint40(block.timestamp);
        g.trainerClock = clock;
        g.auditorClock = clock;
        g.phase = Phase.AwaitingData;
        g.taskId = uint48(taskId);
        g.auditor = msg.sender;
        g.availability = true;
        g.piece = piece;
        // The window's end is after now (checked above), and each extension keeps windowEnds - now
        // <= challengeWindow <= MAX_DURATION < 2^24, so the seconds left fit 24 bits.
        g.windowLeft = uint24(t.windowEnds - block.timestamp);
        emit Challenged(taskId, gameId, msg.sender, false, index, index);
        emit DataRequested(gameId, taskId, index, piece, uint64(block.timestamp) + clock);
    }

    /// @notice Trainer's move: reveal leaf mid = (lo + hi) / 2 with its proof against the state root.
    /// @param gameId The game.
    /// @param leaf The trainer's state hash after step mid.
    /// @param proof Inclusion proof of `leaf` at index mid in the tree of N leaves.
    function reveal(uint256 gameId, bytes32 leaf, bytes32[] calldata proof) external {
        GameSlots storage g = _games[gameId];
        // The hot path of the game: slot 0 is read once and written once, by hand (see GameSlots).
        uint256 word;
        // slither-disable-next-line assembly (both blocks: slot 0 read and written once, see GameSlots)
        assembly ("memory-safe") {
            word := sload(g.slot)
        }
        Phase phase = Phase(uint8(word >> PHASE_SHIFT));
        // INVARIANT: the game exists.
        if (phase == Phase.None) revert GameNotFound(gameId);
        Task storage t = _tasks[word >> TASK_SHIFT];
        // INVARIANT: only the trainer reveals, and only when the auditor has answered the last leaf.
        _checkTurn(gameId, phase, Phase.AwaitingReveal, t.trainer);
        // INVARIANT: the trainer's clock has time left.
        uint32 left = _spend(gameId, uint40(word >> LAST_MOVE_SHIFT), uint32(word >> TRAINER_CLOCK_SHIFT));
        uint48 mid = uint48(((word & MASK48) + ((word >> HI_SHIFT) & MASK48)) >> 1);
        // INVARIANT: the revealed leaf is leaf mid of the committed tree.
        if (!MerkleProof.verify(t.stateRoot, mid, t.numLeaves, leaf, proof)) revert InvalidProof(mid, leaf);
        word = (word & REVEAL_KEEP) | (block.timestamp << LAST_MOVE_SHIFT) | (uint256(left) << TRAINER_CLOCK_SHIFT)
            | (uint256(Phase.AwaitingResponse) << PHASE_SHIFT);
        assembly ("memory-safe") {
            sstore(g.slot, word)
        }
        g.midLeaf = leaf;
        emit LeafRevealed(gameId, mid, leaf, left);
    }

    /// @notice Auditor's move: agree with the revealed leaf (lo = mid) or dispute it (hi = mid).
    /// @dev At hi == lo + 1 the step hi is pinned and the judge's window opens.
    /// @param gameId The game.
    /// @param agree True when the auditor's own state hash at mid equals the revealed leaf.
    function respond(uint256 gameId, bool agree) external {
        GameSlots storage g = _game(gameId);
        // INVARIANT: only the auditor responds, and only to a revealed leaf.
        _checkTurn(gameId, g.phase, Phase.AwaitingResponse, g.auditor);
        // INVARIANT: the auditor's clock has time left.
        uint32 left = _spend(gameId, g.lastMoveAt, g.auditorClock);
        uint48 lo = g.lo;
        uint48 hi = g.hi;
        uint48 mid = uint48((uint256(lo) + hi) / 2);
        bytes32 midLeaf = g.midLeaf;
        if (agree) {
            lo = mid;
            g.loLeaf = midLeaf;
        } else {
            hi = mid;
            g.hiLeaf = midLeaf;
        }
        bool pinned = hi == lo + 1;
        g.lo = lo;
        g.hi = hi;
        g.lastMoveAt = uint40(block.timestamp);
        g.auditorClock = left;
        g.phase = pinned ? Phase.Pinned : Phase.AwaitingReveal;
        emit Responded(gameId, agree, lo, hi, left);
        if (pinned) {
            uint256 taskId = g.taskId;
            uint64 judgeDeadline = uint64(block.timestamp) + _tasks[taskId].judgeWindow;
            emit StepPinned(gameId, taskId, hi, g.loLeaf, g.hiLeaf, judgeDeadline);
        }
    }

    /// @notice The judge's ruling on the pinned step: the post-state hash it computed by re-running it.
    /// @param gameId The pinned game.
    /// @param computedPostState The judge's state hash after step hi, from leaf lo's state.
    function rule(uint256 gameId, bytes32 computedPostState) external {
        GameSlots storage g = _game(gameId);
        Task storage t = _tasks[g.taskId];
        // INVARIANT: only the task's judge rules, and only a pinned step.
        _checkTurn(gameId, g.phase, Phase.Pinned, t.judge);
        uint64 judgeDeadline = uint64(g.lastMoveAt) + t.judgeWindow;
        // INVARIANT: the ruling comes by the judge's deadline.
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (block.timestamp > judgeDeadline) revert ClockExpired(gameId, judgeDeadline);
        bool trainerWon = computedPostState == g.hiLeaf;
        emit Ruled(gameId, computedPostState, trainerWon);
        _end(gameId, g, t, trainerWon ? Outcome.TrainerWon : Outcome.AuditorWon, EndReason.Ruling);
    }

    /// @notice The trainer's answer to an availability challenge: the demanded piece of log chunk
    ///         `lo` of the game. The chunk's leaf in the committed log tree is
    ///         sha256(uint64 chunkLength || pieceRoot), where pieceRoot is the root of the tree over
    ///         the sha256 of its pieces (PIECE_BYTES each, the last shorter; an empty chunk is one
    ///         empty piece). The length fixes the piece count, so a piece cannot pass for another in a
    ///         tree of another size. The piece is emitted in `DataProvided` for anyone to read; the
    ///         auditor's bond goes back (nobody was shown wrong). The challenge window then ends no
    ///         sooner than now plus what was left of it at the demand (`WindowExtended`): the time
    ///         the trainer took to answer is not taken from the auditors.
    /// @param gameId The availability game.
    /// @param chunkLength The chunk's length in bytes.
    /// @param pieceRoot The root of the chunk's piece tree.
    /// @param data The piece's bytes: piece `piece % count` of the chunk, count = its piece count.
    /// @param pieceProof Inclusion proof of sha256(data) at that index in the piece tree of count leaves.
    /// @param proof Inclusion proof of the chunk's leaf at index lo in the log tree of N leaves.
    function provideData(
        uint256 gameId,
        uint64 chunkLength,
        bytes32 pieceRoot,
        bytes calldata data,
        bytes32[] calldata pieceProof,
        bytes32[] calldata proof
    ) external {
        GameSlots storage g = _game(gameId);
        Task storage t = _tasks[g.taskId];
        // INVARIANT: only the trainer answers, and only an open availability challenge.
        _checkTurn(gameId, g.phase, Phase.AwaitingData, t.trainer);
        // INVARIANT: the trainer's clock has time left.
        _spend(gameId, g.lastMoveAt, g.trainerClock);
        // INVARIANT: the length and piece root are the committed chunk's (its leaf lo in the log tree).
        _checkChunkLeaf(t, g.lo, chunkLength, pieceRoot, proof);
        // INVARIANT: the data is the demanded piece of that chunk (reduced by its piece count).
        uint32 piece = _takePiece(g, chunkLength, pieceRoot, data, pieceProof);
        emit DataProvided(gameId, g.taskId, g.lo, piece, chunkLength, data);
        _extendWindow(t, g, block.timestamp);
        _end(gameId, g, t, Outcome.Answered, EndReason.DataProvided);
    }

    /// @notice End a game whose mover's clock ran out (the mover loses), whose judge deadline passed
    ///         (the game is void), or whose demanded piece was not posted in time (the trainer loses,
    ///         unless another game of the task got the same piece meanwhile). Anyone may call it.
    /// @param gameId The game.
    function timeout(uint256 gameId) external {
        GameSlots storage g = _game(gameId);
        Phase phase = g.phase;
        // INVARIANT: an ended game stays ended.
        if (phase == Phase.Ended) revert GameOver(gameId, g.outcome);
        uint256 taskId = g.taskId;
        Task storage t = _tasks[taskId];
        uint64 due = _deadline(g, t);
        // INVARIANT: a timeout needs the deadline to have passed.
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (block.timestamp <= due) revert ClockRunning(gameId, due);
        if (phase == Phase.AwaitingReveal) {
            _end(gameId, g, t, Outcome.AuditorWon, EndReason.Timeout);
        } else if (phase == Phase.AwaitingResponse) {
            _end(gameId, g, t, Outcome.TrainerWon, EndReason.Timeout);
        } else if (phase == Phase.AwaitingData) {
            // The demand is met when its piece (reduced by the count an answer made known, if any)
            // was posted in another game of the task.
            uint64 index = g.lo;
            uint32 piece = _reduced(taskId, index, g.piece);
            uint64 postedAt = _provided[taskId][_pieceKey(index, piece)];
            if (postedAt != 0) {
                // The demand was met when its piece was posted, not when this timeout came.
                _extendWindow(t, g, postedAt);
                _end(gameId, g, t, Outcome.Answered, EndReason.DataProvided);
            } else {
                // Not extended: the trainer has lost the task, so nobody needs more time, and a
                // piece never posted could be demanded again and again to hold the money back.
                _end(gameId, g, t, Outcome.AuditorWon, EndReason.Timeout);
            }
        } else {
            _end(gameId, g, t, Outcome.Void, EndReason.JudgeTimeout);
        }
    }

    /// @notice Credit the auditor of a game that ended AuditorWon its share of the trainer's
    ///         forfeited bond, once the task is finalized (the share is fixed then). Anyone may call it.
    /// @param gameId The game.
    function claimReward(uint256 gameId) external {
        GameSlots storage g = _game(gameId);
        // INVARIANT: only a game the auditor won has a reward.
        if (g.outcome != Outcome.AuditorWon) revert NoReward(gameId, g.outcome);
        uint256 taskId = g.taskId;
        Task storage t = _tasks[taskId];
        // INVARIANT: the share is known once every game of the task has ended and it is finalized.
        if (t.status != TaskStatus.Finalized) revert WrongTaskStatus(taskId, t.status);
        // INVARIANT: a reward is paid once.
        if (g.rewardClaimed) revert RewardAlreadyClaimed(gameId);
        g.rewardClaimed = true;
        (uint128 share,,) = _forfeit(t);
        address auditor = g.auditor;
        emit RewardPaid(gameId, auditor, share);
        _addCredit(auditor, taskId, share);
    }

    /*//////////////////////////////////////////////////////////////
                                 MONEY
    //////////////////////////////////////////////////////////////*/

    /// @notice Send the caller all of its credit.
    function withdraw() external {
        uint256 amount = _credit[msg.sender];
        // INVARIANT: there is something to withdraw.
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        _credit[msg.sender] = 0;
        emit Withdrawn(msg.sender, amount);
        // slither-disable-next-line low-level-calls (the ether send; credit zeroed first, result checked)
        (bool sent,) = msg.sender.call{value: amount}("");
        if (!sent) revert TransferFailed(msg.sender, amount);
    }

    /*//////////////////////////////////////////////////////////////
                                 VIEWS
    //////////////////////////////////////////////////////////////*/

    /// @notice The task `taskId`; reverts TaskNotFound for an unknown id.
    function task(uint256 taskId) external view returns (Task memory) {
        return _task(taskId);
    }

    /// @notice The game `gameId`; reverts GameNotFound for an unknown id.
    function game(uint256 gameId) external view returns (Game memory) {
        GameSlots storage g = _game(gameId);
        return Game({
            lo: g.lo,
            hi: g.hi,
            lastMoveAt: g.lastMoveAt,
            trainerClock: g.trainerClock,
            auditorClock: g.auditorClock,
            phase: g.phase,
            auditor: g.auditor,
            taskId: g.taskId,
            disputeInit: g.disputeInit,
            availability: g.availability,
            piece: g.piece,
            windowLeft: g.windowLeft,
            outcome: g.outcome,
            reason: g.reason,
            rewardClaimed: g.rewardClaimed,
            loLeaf: g.loLeaf,
            hiLeaf: g.hiLeaf,
            midLeaf: g.midLeaf
        });
    }

    /// @notice Withdrawable credit of `account`.
    function credit(address account) external view returns (uint256) {
        return _credit[account];
    }

    /// @notice Wei burnt so far: the halves of forfeited trainer bonds, locked in this contract for good.
    function burnt() external view returns (uint256) {
        return _burnt;
    }

    /// @notice Number of tasks created; ids run from 1 to this.
    function taskCount() external view returns (uint256) {
        return _taskCount;
    }

    /// @notice Number of games opened; ids run from 1 to this.
    function gameCount() external view returns (uint256) {
        return _gameCount;
    }

    /// @notice Seconds left on both clocks now; the running clock is reduced by the time elapsed.
    /// @return trainer The trainer's clock.
    /// @return auditor The auditor's clock.
    function clockLeft(uint256 gameId) external view returns (uint32 trainer, uint32 auditor) {
        GameSlots storage g = _game(gameId);
        trainer = g.trainerClock;
        auditor = g.auditorClock;
        uint256 elapsed = block.timestamp - g.lastMoveAt;
        Phase phase = g.phase;
        bool trainerMoves = phase == Phase.AwaitingReveal || phase == Phase.AwaitingData;
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (trainerMoves) trainer = elapsed >= trainer ? 0 : uint32(trainer - elapsed);
        if (phase == Phase.AwaitingResponse) auditor = elapsed >= auditor ? 0 : uint32(auditor - elapsed);
    }

    /// @notice The time after which `timeout` succeeds: the mover's clock end (the trainer's for an
    ///         availability challenge), or the judge's deadline when pinned; 0 once the game has ended.
    function deadline(uint256 gameId) external view returns (uint64) {
        GameSlots storage g = _game(gameId);
        if (g.phase == Phase.Ended) return 0;
        return _deadline(g, _tasks[g.taskId]);
    }

    /// @notice True when `leaf` is leaf `index` of the tree of `size` leaves with `root` (the same
    ///         check reveal and commit make); lets agents check a proof before sending it.
    function verifyLeaf(bytes32 root, uint64 index, uint64 size, bytes32 leaf, bytes32[] calldata proof)
        external
        view
        returns (bool)
    {
        return MerkleProof.verify(root, index, size, leaf, proof);
    }

    /*//////////////////////////////////////////////////////////////
                                 INTERNAL
    //////////////////////////////////////////////////////////////*/

    function _task(uint256 taskId) internal view returns (Task storage t) {
        t = _tasks[taskId];
        if (t.status == TaskStatus.None) revert TaskNotFound(taskId);
    }

    function _game(uint256 gameId) internal view returns (GameSlots storage g) {
        g = _games[gameId];
        if (g.phase == Phase.None) revert GameNotFound(gameId);
    }

    /// @dev Checks shared by every move, in the documented order: ended, phase, caller.
    function _checkTurn(uint256 gameId, Phase phase, Phase expected, address mover) internal view {
        if (phase == Phase.Ended) revert GameOver(gameId, _games[gameId].outcome);
        if (phase != expected) revert NotYourTurn(gameId, phase);
        if (msg.sender != mover) revert Unauthorized(msg.sender, mover);
    }

    /// @dev The mover's clock after this move; reverts ClockExpired when the move comes too late.
    function _spend(uint256 gameId, uint40 lastMoveAt, uint32 clock) internal view returns (uint32) {
        uint256 elapsed = block.timestamp - lastMoveAt;
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (elapsed > clock) revert ClockExpired(gameId, uint64(lastMoveAt) + clock);
        return uint32(clock - elapsed);
    }

    function _deadline(GameSlots storage g, Task storage t) internal view returns (uint64) {
        Phase phase = g.phase;
        uint64 last = g.lastMoveAt;
        if (phase == Phase.AwaitingReveal || phase == Phase.AwaitingData) return last + g.trainerClock;
        if (phase == Phase.AwaitingResponse) return last + g.auditorClock;
        return last + t.judgeWindow;
    }

    /// @dev Checks shared by both kinds of challenge, in the documented order.
    function _checkChallenger(uint256 taskId, Task storage t) internal view {
        // INVARIANT: only a committed, unsettled task can be challenged.
        if (t.status != TaskStatus.Committed) revert WrongTaskStatus(taskId, t.status);
        // INVARIANT: challenges come before the window ends.
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (block.timestamp >= t.windowEnds) revert WindowClosed(taskId, t.windowEnds);
        // INVARIANT: the trainer and the judge cannot be auditors of the task.
        if (msg.sender == t.trainer || msg.sender == t.judge) revert ChallengerNotAllowed(msg.sender);
        // INVARIANT: the auditor posts exactly its bond.
        if (msg.value != t.auditorBond) revert WrongBond(msg.value, t.auditorBond);
    }

    /// @dev The piece count of a chunk of `length` bytes: ceil(length / PIECE_BYTES), and 1 for an
    ///      empty chunk (one empty piece).
    function _pieces(uint64 length) internal pure returns (uint64) {
        if (length == 0) return 1;
        return uint64((uint256(length) + PIECE_BYTES - 1) / PIECE_BYTES);
    }

    /// @dev The piece a demand for `piece` of chunk `index` names: reduced modulo the chunk's piece
    ///      count once an answer has made it known, as demanded before.
    function _reduced(uint256 taskId, uint64 index, uint32 piece) internal view returns (uint32) {
        uint64 count = _pieceCount[taskId][index];
        // piece % count <= piece, so it fits 32 bits.
        return count == 0 ? piece : uint32(piece % count);
    }

    /// @dev The key of piece `piece` of chunk `index` in `_provided`.
    function _pieceKey(uint64 index, uint32 piece) internal pure returns (uint256) {
        return (uint256(index) << 32) | piece;
    }

    /// @dev Reverts InvalidProof unless sha256(length || pieceRoot) is leaf `index` of the log tree.
    function _checkChunkLeaf(
        Task storage t,
        uint64 index,
        uint64 length,
        bytes32 pieceRoot,
        bytes32[] calldata proof
    ) internal view {
        bytes32 leaf = sha256(abi.encodePacked(length, pieceRoot));
        if (!MerkleProof.verify(t.logRoot, index, t.numLeaves, leaf, proof)) revert InvalidProof(index, leaf);
    }

    /// @dev Checks that `data` is the piece game `g` demands of its chunk (`length` bytes, piece
    ///      tree root `pieceRoot`, already checked against the log root) and records it posted:
    ///      the chunk's piece count, the piece, and the piece answered in the game.
    /// @return piece The demanded piece reduced modulo the chunk's piece count.
    function _takePiece(
        GameSlots storage g,
        uint64 length,
        bytes32 pieceRoot,
        bytes calldata data,
        bytes32[] calldata pieceProof
    ) internal returns (uint32 piece) {
        uint64 count = _pieces(length);
        // g.piece % count <= g.piece, so it fits 32 bits.
        piece = uint32(g.piece % count);
        uint64 index = g.lo;
        bytes32 pieceHash = sha256(data);
        if (!MerkleProof.verify(pieceRoot, piece, count, pieceHash, pieceProof)) {
            revert InvalidPieceProof(index, piece, pieceHash);
        }
        uint256 taskId = g.taskId;
        mapping(uint64 => uint64) storage counts = _pieceCount[taskId];
        if (counts[index] == 0) counts[index] = count;
        _provided[taskId][_pieceKey(index, piece)] = uint64(block.timestamp);
        g.piece = piece;
    }

    /// @dev The time the trainer takes to answer is given back to the window (docs/contract.md
    ///      "Availability"): once availability game `g` is met at `closedAt` (its piece posted, in
    ///      `g` or another game), the window ends no sooner than `closedAt` plus what was left of it
    ///      when the piece was demanded. Only the trainer's own delay in answering extends it, so a
    ///      trainer that answers each demand at the last second cannot run the auditors' window
    ///      out, and an auditor cannot stretch it beyond the time the trainer takes (each piece is
    ///      posted once).
    function _extendWindow(Task storage t, GameSlots storage g, uint256 closedAt) internal {
        uint256 ends = closedAt + g.windowLeft;
        // slither-disable-next-line timestamp (by design: the game's clocks; docs/contract.md "Slither")
        if (ends > t.windowEnds) {
            t.windowEnds = uint64(ends);
            emit WindowExtended(g.taskId, uint64(ends));
        }
    }

    function _validDuration(uint32 seconds_) internal pure returns (bool) {
        return seconds_ != 0 && seconds_ <= MAX_DURATION;
    }

    /// @dev TaskCreated from storage (fewer stack slots than from the arguments).
    function _emitCreated(uint256 taskId, Task storage t) internal {
        emit TaskCreated(
            taskId,
            t.trainer,
            t.judge,
            t.client,
            t.specHash,
            t.keyHash,
            t.numLeaves,
            t.payment,
            t.trainerBond,
            t.auditorBond,
            t.clockAllowance,
            t.challengeWindow,
            t.judgeWindow,
            t.commitWindow
        );
    }

    /// @dev The split of a forfeited trainer bond B among m = auditorWins winning games
    ///      (docs/contract.md "Money"): floor(B / 2) burnt; each game's share is the rest divided
    ///      by m, at most one auditor bond; the client gets what the shares leave.
    function _forfeit(Task storage t) internal view returns (uint128 share, uint128 burn, uint256 toClient) {
        uint128 bond = t.trainerBond;
        uint32 wins = t.auditorWins; // >= 1: the trainer lost a game
        burn = bond / 2;
        uint128 pool = bond - burn;
        share = pool / wins;
        if (share > t.auditorBond) share = t.auditorBond;
        toClient = pool - uint256(share) * wins;
    }

    /// @dev Ends a game and credits its auditor bond (docs/contract.md "Money"). Effects only, no
    ///      transfer. The trainer's bond is settled at finalize, not here, so the order in which
    ///      games end (which the trainer controls) changes nobody's pay.
    function _end(uint256 gameId, GameSlots storage g, Task storage t, Outcome outcome, EndReason reason) internal {
        g.phase = Phase.Ended;
        g.outcome = outcome;
        g.reason = reason;
        --t.liveGames;
        uint256 taskId = g.taskId;
        address auditor = g.auditor;
        address winner = address(0); // stays zero when nobody was shown wrong (Void, Answered)
        if (outcome == Outcome.TrainerWon) {
            winner = t.trainer;
        } else if (outcome == Outcome.AuditorWon) {
            winner = auditor;
            t.trainerLost = true;
            ++t.auditorWins;
        } else if (outcome == Outcome.Void) {
            t.anyVoid = true;
        }
        emit GameEnded(gameId, taskId, outcome, reason, winner);
        // The auditor's bond goes to the trainer when the trainer won, else back to the auditor.
        _addCredit(outcome == Outcome.TrainerWon ? winner : auditor, taskId, t.auditorBond);
    }

    function _addCredit(address account, uint256 taskId, uint256 amount) internal {
        if (amount == 0) return;
        _credit[account] += amount;
        emit Credited(account, taskId, amount);
    }
}
