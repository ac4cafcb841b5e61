// Residual-bound requantization lane: y = sat32(res + sat32(round_half_up((acc + bias) * M / 2**S))).
// Mirrors integer_model.requantize_int32 followed by the residual add `(r + ...).clamp(int32)`; with
// res = 0 it is the logits' requantization (LM head) and the embedding row's scaling to the residual
// scale. M is 15 bits (in [2**14, 2**15)), S in [1, 62]. ACC_W = 32 (int8 GEMV) or 48 (int4 GEMV).
// Pipeline: 4 register stages (add bias, multiply, round+shift+saturate, residual add+saturate); II = 1.
module requant32 #(
    parameter ACC_W = 32
) (
    input  wire                    clk,
    input  wire                    in_valid,
    input  wire signed [ACC_W-1:0] acc,
    input  wire signed [31:0]      bias,
    input  wire        [14:0]      mult,
    input  wire        [5:0]       shift,
    input  wire signed [31:0]      res,
    output reg                     out_valid,
    output reg  signed [31:0]      y
);
    localparam SUM_W  = (ACC_W > 32 ? ACC_W : 32) + 1;
    localparam PROD_W = SUM_W + 16;
    localparam signed [33:0] MAX32 = 34'sd2147483647;
    localparam signed [33:0] MIN32 = -34'sd2147483648;

    reg                     v1, v2, v3;
    reg signed [SUM_W-1:0]  sum1;
    reg        [14:0]       m1;
    reg        [5:0]        s1, s2;
    reg signed [31:0]       r1, r2, r3;
    reg signed [PROD_W-1:0] prod2;
    reg signed [31:0]       q3;

    wire        [PROD_W:0] one_sh = {{PROD_W{1'b0}}, 1'b1} << s2;
    wire signed [PROD_W:0] half   = $signed({1'b0, one_sh[PROD_W:1]});
    wire signed [PROD_W:0] rnd    = $signed({prod2[PROD_W-1], prod2}) + half;
    wire signed [PROD_W:0] shr    = rnd >>> s2;
    wire signed [33:0]     total  = $signed(r3) + $signed(q3);

    always @(posedge clk) begin
        v1 <= in_valid; sum1 <= $signed(acc) + $signed(bias); m1 <= mult; s1 <= shift; r1 <= res;
        v2 <= v1; prod2 <= sum1 * $signed({1'b0, m1}); s2 <= s1; r2 <= r1;
        v3 <= v2; r3 <= r2;
        if (shr > MAX32)      q3 <= MAX32[31:0];
        else if (shr < MIN32) q3 <= MIN32[31:0];
        else                  q3 <= shr[31:0];
        out_valid <= v3;
        if (total > MAX32)      y <= MAX32[31:0];
        else if (total < MIN32) y <= MIN32[31:0];
        else                    y <= total[31:0];
    end
endmodule
