"""``auber``: AUBER, automated BERT regularisation by layer-wise DQN head pruning (Lee, Lee & Kang,
PLOS ONE 2021, arXiv:2009.14409, §4 "Proposed method" and §5.1 "Experimental settings").

For small training sets (the paper: fewer than 10,000 examples), where pruning heads regularises
the model: the paper reports accuracy *above* the fine-tuned model's. The method decides by itself
how many heads each layer loses. Layer by layer (Algorithm 1):

1. **Split.** Before each layer the training data is split at random 1:2 into mini-train and
   mini-dev (§5.1: "randomly split into 1:2 to yield a mini-training dataset and a mini-dev
   dataset"; the authors' code puts 25 % in its dev part). The rewards are measured on mini-dev, at
   most ``reward_examples`` of it (default 128; the report states the count), and the layer is
   fine-tuned on mini-train. The paper evaluates all of mini-dev; the cap keeps a run of the 6 x 12
   MiniLM near 20 minutes on 2 CPU cores, at a price: an accuracy on 128 examples moves in steps of
   0.78 points, and `docs/benchmarks.md#earlier-studies` shows the agent chasing that noise. So the default reward
   of a classifier is the paper's accuracy only when the rewards see all of mini-dev, and the
   mini-dev loss, a steadier signal, when it is capped (:func:`.split.reward_metric_for`).
2. **State** ("State representation", Theorem 1, eqs. 5-19): for each head h of the layer, the L1 norm
   of its value matrix ||W_V^h||_1, which bounds the head's output ||O_h||_1 <= C ||W_V^h||_1;
   standardised over the layer (mean 0, standard deviation 1) and passed through a softmax, so
   s_l sums to 1. ``state``: ``value-l1`` (the paper's), or the ablations of Table 3: ``query``,
   ``key`` (the L1 norm of those matrices) and ``value-l2`` (the L2 norm; the authors' code computes
   this one although the text says L1).
3. **Actions**: prune head i (i = 1..H) or END. After head i is pruned, entry i of the state is set
   to 0 and the result is the next state; END ends the episode ("Action").
4. **Reward** (eq. 4): ``reward = current_performance - previous_performance``, the change of the
   mini-dev metric caused by the action (the previous one is the unpruned layer's for the first
   action); END's reward is 0 ("it is set to 0 to encourage the DQN agent to prune only when the
   expected change in performance is positive"). Rewards are given to the agent in percentage points
   (the authors' code multiplies by 100). The metric is the task's (accuracy on a whole mini-dev, the
   loss on a capped one, see 1.; the loss for language models, whose reward is then the loss's
   decrease) or ``reward_metric`` (e.g. ``mcc`` for CoLA-like data).
5. **Agent**: the DQN of :mod:`headcut.learned.dqn` (4-layer MLP, 512 hidden, LeakyReLU; replay
   memory 5,000; batch 128; gamma 1; epsilon-greedy 1 -> 0.05 with decay 256, eq. 3; one
   optimisation per episode), trained for ``episodes`` episodes (150), a new agent per layer.
6. **Policy**: the trained agent acts greedily from the layer's initial state until END; those heads
   are pruned, then the model is fine-tuned on mini-train with learning rate 2e-6 (§5.1) for
   ``layer_epochs`` epochs (the paper gives no length; 1).
7. **End**: after the last layer, the model is fine-tuned on the training data with early stopping
   (patience 20 evaluations, §5.1). The paper names no data to stop on; headcut holds out
   ``reward_examples`` random training examples, fine-tunes on the rest and stops on those (never
   on ``--eval-data``, which measures the result), evaluating 20 times per epoch, for at most
   ``epochs`` (default 2) epochs or ``max_steps`` steps at ``lr`` (2e-6, the authors' single
   fine-tuning rate), and keeps the best evaluation's weights (the pruned model before this
   fine-tune counts as a candidate).

Rules the paper's text leaves implicit, as headcut applies them:

* **The last head stays.** An episode is forced to END when one head (unit) of the layer is left,
  as the authors' code does ("if episode_pruned_num != 11"): AUBER never empties a layer unless
  ``allow_empty_layers``; ``--min-heads-per-block`` raises that floor.
* **Removed heads are not actions**: the agent never picks a head it already pruned (the authors'
  code gives such actions a Q-value of -5).
* **Layer order**: bottom-up, the first layer first; ``reverse`` gives the paper's AUBER-Reverse
  ablation (Table 3). A "layer" is a prune unit set of :mod:`headcut.pruning.units`: one attention
  block, or every block sharing weights (ALBERT); encoder-decoder models are processed block by
  block in the model's order (encoder, then decoder self- and cross-attention). Under grouped-query
  attention with ``--gqa group``/``auto`` an action removes a whole KV group, and the state has one
  entry per group (the norm of its heads).
* **Upper bound**: with ``--keep K``/``--sparsity S`` (optional) the kept heads are held to at most
  K: when the agent's own choices would keep more, each remaining layer's greedy policy must first
  remove its share of the excess (ceil(excess / layers left), or more if the later layers cannot
  take the rest), choosing by its Q-values; the report counts the heads so forced.

Practical, and exact: the rewards are computed in-process. The layers below the current one do not
change during its episodes, so their output on mini-dev is recorded once per layer and replayed
(:mod:`headcut.model.layer_cache`; checked against a full forward, else the full model runs), and the
metric of each set of pruned heads is computed once (the authors' ``transitions`` dictionary).

The modules, one idea each: :mod:`.options` (:class:`AuberOptions`), :mod:`.split` (1. the mini-train/mini-dev
split and the reward's metric), :mod:`.state` (2. the units an action removes and the state), :mod:`.environment`
(4. one layer's rewards), :mod:`.agent` (3., 5. and 6.: the valid actions, the agent's episodes and its greedy
policy), :mod:`.report` (the report's ``auber`` section and the summary) and :mod:`.method` (the method object:
the layers in turn, the upper bound, 6.'s and 7.'s fine-tunes).
"""
