"""FedNoRo: logit adjustment, distillation with temperature, the ramp-up, stage and role."""

from __future__ import annotations

import math

import pytest
import torch

from client_sdk.recipes import (
    LocalData,
    get_recipe,
    kd_loss,
    kd_per_sample,
    kd_weight,
    log_class_prior,
    logit_adjusted_cross_entropy,
)
from client_sdk.recipes.errors import InvalidRoundContextError, ModelContractError, RecipeError
from client_sdk.recipes.fednoro import match_label_marginal, scaled_log_prior
from tests.client_sdk.recipes.helpers import (
    frozen,
    linear,
    make_context,
    make_data,
    one_hot_data,
    scaled_identity,
    tiny_mlp,
)


class TestLogitAdjustment:
    def test_zero_logits_give_minus_log_prior(self) -> None:
        # counts [2, 1, 1] -> pi = [0.5, 0.25, 0.25]. With zero logits the adjusted logits are
        # log pi, so softmax = pi and CE(label c) = -log pi_c.
        # labels [0, 1]: mean(-log 0.5, -log 0.25) = (0.693147 + 1.386294) / 2 = 1.039721
        log_prior = log_class_prior(torch.tensor([2, 1, 1]))
        loss = logit_adjusted_cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1]), log_prior)
        assert loss.item() == pytest.approx(1.039721, abs=1e-5)

    def test_offset_is_added_to_the_logits(self) -> None:
        # counts [1, 1, 2] -> pi = [0.25, 0.25, 0.5]; logits [ln 2, 0, 0].
        # exp(adjusted) = [2 * 0.25, 0.25, 0.5] = [0.5, 0.25, 0.5] -> softmax [0.4, 0.2, 0.4]
        # CE(label 1) = -ln 0.2 = 1.609438
        log_prior = log_class_prior(torch.tensor([1, 1, 2]))
        logits = torch.tensor([[math.log(2.0), 0.0, 0.0]])
        loss = logit_adjusted_cross_entropy(logits, torch.tensor([1]), log_prior)
        assert loss.item() == pytest.approx(1.609438, abs=1e-5)

    def test_absent_class_has_zero_probability_and_no_nan(self) -> None:
        # counts [3, 1, 0] -> pi = [0.75, 0.25, 0]; zero logits -> softmax [0.75, 0.25, 0]
        # CE(label 0) = -ln 0.75 = 0.287682; the absent class gets no gradient.
        log_prior = log_class_prior(torch.tensor([3, 1, 0]), "zero")
        assert math.isinf(float(log_prior[2]))
        logits = torch.zeros(1, 3, requires_grad=True)
        loss = logit_adjusted_cross_entropy(logits, torch.tensor([0]), log_prior)
        torch.autograd.backward(loss)
        assert loss.item() == pytest.approx(0.287682, abs=1e-5)
        assert logits.grad is not None
        assert torch.isfinite(logits.grad).all()
        assert float(logits.grad[0, 2]) == 0.0

    def test_bad_counts_are_rejected(self) -> None:
        with pytest.raises(RecipeError, match="counts"):
            log_class_prior(torch.tensor([0, 0, 0]))
        with pytest.raises(RecipeError, match="absent"):
            log_class_prior(torch.tensor([1, 1, 0]), "uniform")

    def test_absent_class_takes_the_rarest_held_prior_and_is_pushed_down(self) -> None:
        # counts [3, 1, 0], "rarest" -> pi = [0.75, 0.25, 0.25] (not normalised: only the
        # offsets matter). Zero logits -> softmax [0.75, 0.25, 0.25] / 1.25 = [0.6, 0.2, 0.2];
        # CE(label 0) = -ln 0.6 = 0.510826; d/d logit_2 = softmax_2 = 0.2 > 0 (pushed down).
        log_prior = log_class_prior(torch.tensor([3, 1, 0]))
        assert log_prior.tolist() == pytest.approx([math.log(0.75), math.log(0.25), math.log(0.25)])
        logits = torch.zeros(1, 3, requires_grad=True)
        loss = logit_adjusted_cross_entropy(logits, torch.tensor([0]), log_prior)
        torch.autograd.backward(loss)
        assert loss.item() == pytest.approx(0.510826, abs=1e-5)
        assert logits.grad is not None
        assert float(logits.grad[0, 2]) == pytest.approx(0.2, abs=1e-6)

    def test_two_balanced_classes_give_plain_cross_entropy(self) -> None:
        # counts [2, 0, 2, 0]: every class's offset is ln 0.5, a constant shift of the logits,
        # which softmax ignores: the loss is plain cross-entropy.
        gen = torch.Generator().manual_seed(3)
        logits = torch.randn(6, 4, generator=gen)
        labels = torch.tensor([0, 2, 2, 0, 0, 2])
        log_prior = log_class_prior(torch.tensor([2, 0, 2, 0]))
        adjusted = logit_adjusted_cross_entropy(logits, labels, log_prior)
        plain = torch.nn.functional.cross_entropy(logits, labels)
        assert adjusted.item() == pytest.approx(plain.item(), abs=1e-6)


class TestKnowledgeDistillation:
    def test_kl_with_teacher_temperature_and_batchmean(self) -> None:
        # T = 0.8. Row 1: teacher logits [0.8 ln 3, 0, 0] -> / T = [ln 3, 0, 0]
        #   -> p_t = [3, 1, 1] / 5 = [0.6, 0.2, 0.2]. Student: zero logits, uniform prior
        #   -> q = [1/3, 1/3, 1/3]. KL(p_t || q) = 0.6 ln 1.8 + 2 * 0.2 ln 0.6
        #   = 0.352672 - 0.204330 = 0.148342.
        # Row 2: teacher zeros -> p_t uniform = q -> KL 0.
        # batchmean: (0.148342 + 0) / 2 = 0.074171. (KL(q || p_t) would be 0.144622 / 2; a
        # teacher without temperature, or a mean over B*C entries, also differ.)
        teacher = torch.tensor([[0.8 * math.log(3.0), 0.0, 0.0], [0.0, 0.0, 0.0]])
        student = torch.zeros(2, 3)
        log_prior = log_class_prior(torch.tensor([1, 1, 1]))
        loss = kd_loss(student, teacher, log_prior, temperature=0.8)
        assert loss.item() == pytest.approx(0.074171, abs=1e-5)

    def test_absent_class_is_left_out_of_the_kl(self) -> None:
        # counts [1, 1, 0] -> q = softmax(0 + log pi) = [0.5, 0.5, 0]; p_t = [0.6, 0.2, 0.2].
        # Sum over the present classes only: 0.6 ln(0.6/0.5) + 0.2 ln(0.2/0.5)
        # = 0.109393 - 0.183258 = -0.073865 (the teacher's mass on the absent class is ignored).
        teacher = torch.tensor([[0.8 * math.log(3.0), 0.0, 0.0]])
        student = torch.zeros(1, 3, requires_grad=True)
        log_prior = log_class_prior(torch.tensor([1, 1, 0]), "zero")
        loss = kd_loss(student, teacher, log_prior, temperature=0.8)
        torch.autograd.backward(loss)
        assert loss.item() == pytest.approx(-0.073865, abs=1e-5)
        assert student.grad is not None
        assert torch.isfinite(student.grad).all()
        assert float(student.grad[0, 2]) == 0.0

    def test_teacher_gets_no_gradient(self) -> None:
        teacher = torch.randn(4, 3, requires_grad=True)
        student = torch.randn(4, 3, requires_grad=True)
        torch.autograd.backward(kd_loss(student, teacher, torch.zeros(3), 0.8))
        assert teacher.grad is None
        assert student.grad is not None

    def test_per_sample_terms_average_to_the_batch_loss(self) -> None:
        gen = torch.Generator().manual_seed(4)
        student, teacher = torch.randn(6, 3, generator=gen), torch.randn(6, 3, generator=gen)
        log_prior = log_class_prior(torch.tensor([3, 2, 1]))
        each = kd_per_sample(student, teacher, log_prior, 0.8)
        assert each.shape == (6,)
        assert each.mean().item() == pytest.approx(kd_loss(student, teacher, log_prior, 0.8).item())

    def test_kl_is_zero_when_student_equals_teacher_at_t1(self) -> None:
        logits = torch.randn(5, 3)
        assert kd_loss(logits, logits, torch.zeros(3), 1.0).item() == pytest.approx(0.0, abs=1e-6)

    def test_ramp_up(self) -> None:
        # w = 0.8 exp(-5 (1 - lambda)^2), lambda = clip((t - 10) / 39, 0, 1)
        # t = 10: lambda = 0 -> 0.8 e^-5 = 0.005390
        # t = 30: lambda = 20/39 -> (1 - lambda)^2 = 0.237344 -> 0.8 e^-1.186719 = 0.244177
        # t >= 49: lambda = 1 -> 0.8; t < 10: lambda = 0 (clipped)
        assert kd_weight(10, 10, 39, 0.8) == pytest.approx(0.005390, abs=1e-6)
        assert kd_weight(30, 10, 39, 0.8) == pytest.approx(0.244177, abs=1e-6)
        assert kd_weight(49, 10, 39, 0.8) == pytest.approx(0.8)
        assert kd_weight(90, 10, 39, 0.8) == pytest.approx(0.8)
        assert kd_weight(3, 10, 39, 0.8) == pytest.approx(0.005390, abs=1e-6)
        assert kd_weight(10, 10, 0, 0.8) == pytest.approx(0.8)


class TestLabelMarginal:
    def test_identical_samples_take_the_label_mix(self) -> None:
        # Two samples with the same uniform teacher, labels 3:1. Every sample then gets the
        # label mix [0.75, 0.25] itself: logits (after / T) differ by ln 3, i.e. by T ln 3 before.
        out = match_label_marginal(torch.zeros(2, 2), 0.8, torch.tensor([3, 1])).logits
        assert (out[:, 0] - out[:, 1]).tolist() == pytest.approx([0.8 * math.log(3.0)] * 2)
        assert torch.softmax(out / 0.8, 1)[0].tolist() == pytest.approx([0.75, 0.25])

    def test_two_samples_solved_by_hand(self) -> None:
        # T = 1, teacher p1 = [0.8, 0.2], p2 = [0.2, 0.8] (logits [ln 4, 0], [0, ln 4]); labels
        # 3:1. With r = exp(b0 - b1): 4r / (4r + 1) + r / (r + 4) = 1.5, i.e.
        # 2 r^2 - 8.5 r - 6 = 0, r = (8.5 + sqrt(120.25)) / 4 = 4.866476.
        teacher = torch.tensor([[math.log(4.0), 0.0], [0.0, math.log(4.0)]])
        out = match_label_marginal(teacher, 1.0, torch.tensor([3, 1])).logits
        shift = (out - teacher)[:, 0] - (out - teacher)[:, 1]
        assert shift.tolist() == pytest.approx([math.log(4.866476)] * 2, abs=1e-5)
        assert torch.softmax(out, 1).mean(0).tolist() == pytest.approx([0.75, 0.25], abs=1e-5)

    def test_a_teacher_that_already_matches_is_left_as_it_is(self) -> None:
        teacher = torch.tensor([[math.log(4.0), 0.0], [0.0, math.log(4.0)]])
        out = match_label_marginal(teacher, 1.0, torch.tensor([5, 5])).logits
        assert out.flatten().tolist() == pytest.approx(teacher.flatten().tolist(), abs=1e-6)

    def test_an_absent_class_gets_no_mass(self) -> None:
        # Labels of classes 0 and 1 only; the teacher puts most mass on class 2. The result
        # is -inf there, and the held classes share the sample as the labels do (1:1).
        teacher = torch.tensor([[0.0, 0.0, 5.0], [0.0, 0.0, 5.0]])
        out = match_label_marginal(teacher, 0.8, torch.tensor([2, 2, 0])).logits
        assert out[:, 2].tolist() == [-math.inf, -math.inf]
        assert torch.softmax(out / 0.8, 1).flatten().tolist() == pytest.approx([0.5, 0.5, 0.0] * 2)

    def test_a_class_the_teacher_rules_out_still_gets_its_share(self) -> None:
        # The teacher's class-1 probability underflows to 0 in float32 on both samples
        # (logit gaps of 200 and 150); the labels are 1:1. Each sample is matched, not
        # overflowed: finite offsets, and the sample the teacher found less sure of class 0
        # (gap 150) takes class 1.
        teacher = torch.tensor([[200.0, 0.0], [150.0, 0.0]])
        matched = match_label_marginal(teacher, 1.0, torch.tensor([1, 1]))
        out = matched.logits
        assert torch.isfinite(out).all()
        # converging slowly here (the exact offset 175 is approached from 150): what is left
        # is reported
        assert 1e-6 < matched.log_error < 1e-2
        p = torch.softmax(out.double(), 1)
        assert p.mean(0).tolist() == pytest.approx([0.5, 0.5], abs=1e-3)
        assert p[1, 1].item() > 0.99

    def test_bad_inputs_are_refused(self) -> None:
        with pytest.raises(RecipeError, match="N >= 1"):
            match_label_marginal(torch.zeros(0, 2), 0.8, torch.tensor([1, 1]))
        with pytest.raises(RecipeError, match="positive sum"):
            match_label_marginal(torch.zeros(2, 2), 0.8, torch.tensor([0, 0]))
        with pytest.raises(RecipeError, match="histogram"):
            match_label_marginal(torch.zeros(2, 2), 0.8, torch.tensor([1, 1, 1]))
        for bad in (math.nan, math.inf):
            with pytest.raises(ModelContractError, match="non-finite"):
                match_label_marginal(torch.tensor([[0.0, bad]]), 0.8, torch.tensor([1, 1]))

    def test_the_order_of_the_samples_does_not_matter(self) -> None:
        gen = torch.Generator().manual_seed(3)
        teacher = torch.randn(40, 3, generator=gen) * 2.0
        counts = torch.tensor([25, 10, 5])
        order = torch.randperm(40, generator=gen)
        matched = match_label_marginal(teacher, 0.8, counts)
        out = matched.logits
        permuted = match_label_marginal(teacher[order], 0.8, counts).logits
        assert matched.log_error < 1e-6
        assert permuted.flatten().tolist() == pytest.approx(out[order].flatten().tolist(), abs=1e-5)
        assert torch.softmax(out / 0.8, 1).mean(0).tolist() == pytest.approx(
            [0.625, 0.25, 0.125], abs=1e-4
        )


def test_scaled_log_prior_keeps_absent_classes_finite_only_when_tau_is_zero() -> None:
    inf = float("inf")
    prior = torch.tensor([-0.5, -2.0, -inf])
    assert scaled_log_prior(prior, 0.5).tolist() == [-0.25, -1.0, -inf]
    assert scaled_log_prior(prior, 1.0).tolist() == [-0.5, -2.0, -inf]
    assert scaled_log_prior(prior, 0.0).tolist() == [0.0, 0.0, 0.0]


class TestRecipe:
    @pytest.mark.parametrize(
        ("round_index", "role", "stage", "distilled"),
        [
            (3, "noisy", 1.0, 0.0),
            (12, "clean", 2.0, 0.0),
            (12, None, 2.0, 0.0),
            (12, "noisy", 2.0, 1.0),
        ],
    )
    def test_stage_and_role_choose_the_loss(
        self, round_index: int, role: str | None, stage: float, distilled: float
    ) -> None:
        model, global_model = tiny_mlp(), frozen(tiny_mlp(1))
        ctx = make_context(
            round_index=round_index,
            total_rounds=100,
            role=role,
            hyperparameters={"batch_size": 8, "warmup_rounds": 10},
        )
        report = get_recipe("fednoro").train(model, global_model, make_data(24), ctx)
        assert report.metrics["stage"] == stage
        assert report.metrics["distilled"] == distilled
        assert math.isfinite(report.train_loss)

    @pytest.mark.parametrize(("absent", "moves"), [("zero", False), ("rarest", True)])
    def test_an_absent_class_bias_is_trained_only_with_a_finite_prior(
        self, absent: str, moves: bool
    ) -> None:
        # Data of classes 0 and 1 only (of 3). With the paper's -inf the absent class's logit
        # gets no gradient: its output bias stays exactly where it was. With "rarest" it is a
        # class to score below the true one, and plain SGD lowers its bias.
        before, after = _absent_class_bias_before_after(
            {
                "batch_size": 8,
                "lr": 0.1,
                "momentum": 0.0,
                "absent_class_prior": absent,
                "la_tau": 1.0,  # the paper's logit adjustment (the default is off)
            },
            round_index=0,
            role=None,
        )
        if moves:
            assert after < before - 1e-3
        else:
            assert after == before

    def test_contradicted_distils_exactly_the_samples_the_teacher_contradicts(self) -> None:
        # one_hot_data: 30 samples, the first 6 labels moved to c + 1. The teacher
        # scaled_identity(4) predicts the true class, so it contradicts exactly those 6:
        # kd_fraction = 6 / 30 = 0.2 ("all": 1.0).
        data = one_hot_data(30, num_flipped=6)
        teacher = frozen(scaled_identity(4.0))
        hp = {"batch_size": 8, "warmup_rounds": 0, "ramp_rounds": 0, "kd_samples": "contradicted"}
        ctx = make_context(round_index=3, role="noisy", hyperparameters=hp)
        report = get_recipe("fednoro").train(scaled_identity(1.0), teacher, data, ctx)
        assert report.metrics["kd_fraction"] == pytest.approx(0.2)
        ctx_all = make_context(
            round_index=3, role="noisy", hyperparameters={**hp, "kd_samples": "all"}
        )
        report_all = get_recipe("fednoro").train(scaled_identity(1.0), teacher, data, ctx_all)
        assert report_all.metrics["kd_fraction"] == pytest.approx(1.0)

    def test_kd_scope_classes_distils_only_the_classes_the_coordinator_lists(self) -> None:
        # one_hot_data(30, 6) with 3 classes: labels i % 3 but the first six moved to c + 1,
        # so label 1 is held by samples 0 and 3 (flipped from 0) and 7, 10, ..., 28: 10 of 30,
        # and label 2 likewise by 1, 4 and 8, 11, ..., 29: 10. With the coordinator listing
        # class 1, "classes" distils those 10 (kd_fraction 10 / 30); with "contradicted" as
        # well only the two flipped ones among them (2 / 30); "site", and a site it lists no
        # classes for, distil all 30.
        data = one_hot_data(30, num_flipped=6)
        teacher = frozen(scaled_identity(4.0))
        hp = {"batch_size": 8, "warmup_rounds": 0, "ramp_rounds": 0, "kd_scope": "classes"}

        def fraction(hyperparameters: dict[str, object], named: list[int] | None) -> float:
            ctx = make_context(
                round_index=3, role="noisy", hyperparameters=hyperparameters, distil_classes=named
            )
            report = get_recipe("fednoro").train(scaled_identity(1.0), teacher, data, ctx)
            return float(report.metrics["kd_fraction"])

        assert fraction(hp, [1]) == pytest.approx(10 / 30)
        assert fraction({**hp, "kd_samples": "contradicted"}, [1]) == pytest.approx(2 / 30)
        assert fraction({**hp, "kd_scope": "site"}, [1]) == pytest.approx(1.0)
        unset = {k: v for k, v in hp.items() if k != "kd_scope"}  # the default is "classes"
        assert fraction(unset, [1]) == pytest.approx(10 / 30)
        assert fraction(hp, None) == pytest.approx(1.0)
        assert fraction(hp, [1, 2]) == pytest.approx(20 / 30)

    def test_distil_classes_outside_the_task_are_refused(self) -> None:
        with pytest.raises(InvalidRoundContextError, match="class 3 outside"):
            make_context(distil_classes=[3])
        with pytest.raises(InvalidRoundContextError, match="not a class index"):
            make_context(distil_classes=[True])

    def test_a_teacher_that_agrees_everywhere_leaves_plain_training(self) -> None:
        # No label contradicted: "contradicted" trains a noisy site exactly like a clean one.
        data = one_hot_data(30, num_flipped=0)
        teacher = frozen(scaled_identity(4.0))
        hp = {"batch_size": 8, "warmup_rounds": 0, "ramp_rounds": 0, "kd_samples": "contradicted"}
        noisy, clean = scaled_identity(1.0), scaled_identity(1.0)
        get_recipe("fednoro").train(
            noisy, teacher, data, make_context(round_index=3, role="noisy", hyperparameters=hp)
        )
        get_recipe("fednoro").train(
            clean, teacher, data, make_context(round_index=3, role="clean", hyperparameters=hp)
        )
        assert torch.equal(linear(noisy, 0).weight, linear(clean, 0).weight)

    @pytest.mark.parametrize(("kd_classes", "moves"), [("held", False), ("all", True)])
    def test_held_distillation_leaves_an_absent_class_alone(
        self, kd_classes: str, moves: bool
    ) -> None:
        # Data of classes 0 and 1 only (of 3), full distillation (w = 1: the loss is the KL
        # alone). "held": the KL runs over classes 0 and 1, so the class-2 output bias gets no
        # gradient and stays exactly where it was; "all": the teacher's mass on class 2 moves it.
        hp = {
            "batch_size": 8,
            "lr": 0.1,
            "momentum": 0.0,
            "warmup_rounds": 0,
            "ramp_rounds": 0,
            "kd_weight_max": 1.0,
            "kd_classes": kd_classes,
        }
        before, after = _absent_class_bias_before_after(hp, round_index=3, role="noisy")
        if moves:
            assert abs(after - before) > 1e-4
        else:
            assert after == before

    @pytest.mark.parametrize(("tau", "same"), [(0.0, True), (0.5, False), (1.0, False)])
    def test_la_tau_zero_trains_like_plain_cross_entropy(self, tau: float, same: bool) -> None:
        # Imbalanced labels (prior far from uniform): tau = 0 removes the offsets, and a clean
        # site's FedNoRo round is then FedAvg's round, weight for weight; any tau > 0 is not.
        data = make_data(24)
        data.labels[:18] = 0
        hp = {"batch_size": 8, "lr": 0.1, "momentum": 0.0, "la_tau": tau}
        fednoro, fedavg = tiny_mlp(), tiny_mlp()
        get_recipe("fednoro").train(
            fednoro, frozen(tiny_mlp()), data, make_context(round_index=0, hyperparameters=hp)
        )
        get_recipe("fedavg").train(
            fedavg, frozen(tiny_mlp()), data, make_context(round_index=0, hyperparameters=hp)
        )
        equal = all(
            torch.equal(a, b)
            for a, b in zip(
                fednoro.state_dict().values(), fedavg.state_dict().values(), strict=True
            )
        )
        assert equal == same

    def test_tau_zero_with_the_papers_prior_trains_without_nan(self) -> None:
        # absent_class_prior "zero" gives class 2 (absent) -inf; 0 * -inf must not reach the
        # loss: the offsets are all 0 and the round is plain cross-entropy.
        data = make_data(24)
        data.labels[:18] = 0
        data.labels[18:] = 1
        hp = {"batch_size": 8, "la_tau": 0.0, "absent_class_prior": "zero"}
        report = get_recipe("fednoro").train(
            tiny_mlp(), frozen(tiny_mlp()), data, make_context(hyperparameters=hp)
        )
        assert math.isfinite(report.train_loss)
        assert report.logit_offset is not None
        assert report.logit_offset.tolist() == [0.0, 0.0, 0.0]

    def test_the_report_carries_the_offsets_it_trained_with(self) -> None:
        # 24 samples: 18 of class 0, 6 of class 1, none of class 2 ("rarest": it takes
        # class 1's prior 0.25). tau = 0.5: offsets 0.5 ln 0.75 = -0.143841, 0.5 ln 0.25 =
        # -0.693147 (classes 1 and 2).
        data = make_data(24)
        data.labels[:18] = 0
        data.labels[18:] = 1
        hp = {"batch_size": 8, "la_tau": 0.5}
        report = get_recipe("fednoro").train(
            tiny_mlp(), frozen(tiny_mlp()), data, make_context(hyperparameters=hp)
        )
        assert report.logit_offset is not None
        assert report.logit_offset.tolist() == pytest.approx(
            [-0.143841, -0.693147, -0.693147], abs=1e-6
        )

    def test_full_distillation_pulls_the_student_towards_the_teacher(self) -> None:
        # With w = 1 (kd_weight_max 1, lambda = 1) the noisy client only matches the teacher.
        data = make_data(48, flip=0.3)
        teacher = frozen(tiny_mlp(5))
        student = tiny_mlp(0)
        hp = {
            "batch_size": 8,
            "lr": 0.2,
            "warmup_rounds": 0,
            "ramp_rounds": 0,
            "kd_weight_max": 1.0,
            "kd_temperature": 1.0,
            "local_epochs": 5,
        }

        def disagreement(model: torch.nn.Module) -> float:
            with torch.no_grad():
                p = torch.softmax(teacher(data.inputs), 1)
                q = torch.softmax(
                    model(data.inputs) + log_class_prior(torch.bincount(data.labels)), 1
                )
                return float((p * (p.log() - q.log())).sum(1).mean())

        before = disagreement(student)
        ctx = make_context(round_index=5, role="noisy", hyperparameters=hp)
        get_recipe("fednoro").train(student, teacher, data, ctx)
        assert disagreement(student) < 0.5 * before


@pytest.mark.parametrize("kd_marginal", ["teacher", "labels", None])
def test_a_biased_teacher_passes_its_bias_on_unless_matched_to_the_labels(
    kd_marginal: str | None,
) -> None:
    # 40 samples near the one-hot corners, labels 20:10:10 (all correct). The teacher knows the
    # classes (logits 2x) but adds +3 to class 1, so it calls most samples class 1. Full
    # distillation (w = 1, T = 0.8), 40 epochs: the student (a linear layer, able to fit any
    # target per corner) ends near the target. With the teacher's own mix it calls most samples
    # class 1 (mean softmax about [0.12, 0.81, 0.07]); matched to the labels (the default,
    # None) its mean softmax is the label mix [0.5, 0.25, 0.25] and it calls every sample by
    # its label. (Matching at T = 1 instead of 0.8 would end at [0.512, 0.244, 0.244]; matching
    # to a uniform mix at 1/3 each.)
    gen = torch.Generator().manual_seed(0)
    truth = torch.tensor([0] * 20 + [1] * 10 + [2] * 10)
    x = torch.nn.functional.one_hot(truth, 3).float() + 0.05 * torch.randn(40, 3, generator=gen)
    data = LocalData(x, truth.clone(), true_labels=truth)
    teacher_layer = torch.nn.Linear(3, 3)
    student_layer = torch.nn.Linear(3, 3)
    with torch.no_grad():
        teacher_layer.weight.copy_(2.0 * torch.eye(3))
        teacher_layer.bias.copy_(torch.tensor([0.0, 3.0, 0.0]))
        student_layer.weight.copy_(torch.eye(3))
        student_layer.bias.zero_()
    student = torch.nn.Sequential(student_layer)
    hp: dict[str, object] = {
        "batch_size": 10,
        "lr": 0.5,
        "momentum": 0.0,
        "warmup_rounds": 0,
        "ramp_rounds": 0,
        "kd_weight_max": 1.0,
        "kd_temperature": 0.8,
        "local_epochs": 40,
    }
    if kd_marginal is not None:
        hp["kd_marginal"] = kd_marginal
    report = get_recipe("fednoro").train(
        student,
        frozen(torch.nn.Sequential(teacher_layer)),
        data,
        make_context(round_index=3, role="noisy", hyperparameters=hp),
    )
    with torch.no_grad():
        q = torch.softmax(student(x), 1)
    if kd_marginal == "teacher":
        assert q.mean(0)[1].item() > 0.7
        assert report.metrics["kd_marginal_matched"] == 0.0
    else:
        assert q.mean(0).tolist() == pytest.approx([0.5, 0.25, 0.25], abs=0.005)
        assert torch.equal(q.argmax(1), truth)
        assert report.metrics["kd_marginal_matched"] == 1.0
        assert report.metrics["kd_marginal_error"] < 1e-6


def test_contradicted_samples_are_judged_by_the_matched_teacher() -> None:
    # one_hot_data: 30 samples of 3 classes, none flipped. A teacher that calls everything
    # class 0 (bias +5) contradicts the 20 labels of classes 1 and 2; matched to the labels
    # (1/3 each) it calls every sample by its label and contradicts none.
    data = one_hot_data(30, num_flipped=0)
    layer = torch.nn.Linear(3, 3)
    with torch.no_grad():
        layer.weight.copy_(2.0 * torch.eye(3))
        layer.bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    teacher = frozen(torch.nn.Sequential(layer))
    fractions = {}
    for mix in ("teacher", "labels"):
        hp = {
            "warmup_rounds": 0,
            "ramp_rounds": 0,
            "kd_samples": "contradicted",
            "kd_marginal": mix,
        }
        ctx = make_context(round_index=3, role="noisy", hyperparameters=hp)
        report = get_recipe("fednoro").train(scaled_identity(1.0), teacher, data, ctx)
        fractions[mix] = report.metrics["kd_fraction"]
    assert fractions == {"teacher": pytest.approx(20 / 30), "labels": 0.0}


def test_the_default_mix_is_the_coordinators() -> None:
    # The coordinator fills in nothing the federation left out: the SDK's own default is the
    # one sites train with, and it must be the one the coordinator documents.
    from service.coordinator.hyperparameters import FedNoRoHyperparameters

    assert FedNoRoHyperparameters().kd_marginal == "labels"
    assert FedNoRoHyperparameters().kd_scope == "classes"
    data = make_data(24, flip=0.2)
    base = {"warmup_rounds": 0, "ramp_rounds": 0, "batch_size": 8}
    trained = []
    for hp in (base, {**base, "kd_marginal": "labels"}):
        model = tiny_mlp(0)
        ctx = make_context(round_index=3, role="noisy", hyperparameters=hp)
        get_recipe("fednoro").train(model, frozen(tiny_mlp(4)), data, ctx)
        trained.append(linear(model, 3).weight.detach().clone())
    assert torch.equal(trained[0], trained[1])


def test_an_unknown_kd_marginal_is_refused() -> None:
    hp = {"warmup_rounds": 0, "kd_marginal": "global"}
    ctx = make_context(round_index=3, role="noisy", hyperparameters=hp)
    with pytest.raises(RecipeError, match="kd_marginal"):
        get_recipe("fednoro").train(tiny_mlp(), frozen(tiny_mlp()), make_data(24), ctx)


def _absent_class_bias_before_after(
    hyperparameters: dict[str, object], *, round_index: int, role: str | None
) -> tuple[float, float]:
    """One FedNoRo round on data of classes 0 and 1 only (of 3), from tiny_mlp(0) with
    tiny_mlp(1) as the teacher: the class-2 output bias before and after."""
    full = make_data(48)
    keep = full.labels != 2
    data = type(full)(full.inputs[keep], full.labels[keep], true_labels=full.labels[keep])
    model = tiny_mlp(0)
    before = float(linear(model, 3).bias.detach()[2])
    ctx = make_context(round_index=round_index, role=role, hyperparameters=hyperparameters)
    get_recipe("fednoro").train(model, frozen(tiny_mlp(1)), data, ctx)
    return before, float(linear(model, 3).bias.detach()[2])
