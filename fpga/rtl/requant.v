// Requantization lane: y = sat8(round_half_up((acc + bias) * M / 2**S)).
// Mirrors dfvg.fpga.datapath.fixed_point.requantize bit for bit. M is 15 bits (in [2**14, 2**15)), S in [1, 62].
// Pipeline: 3 register stages (add bias, multiply, round+shift+saturate); II = 1.
module requant #(
    parameter ACC_W = 32
) (
    input  wire                    clk,
    input  wire                    in_valid,
    input  wire signed [ACC_W-1:0] acc,
    input  wire signed [31:0]      bias,
    input  wire        [14:0]      mult,
    input  wire        [5:0]       shift,
    output reg                     out_valid,
    output reg  signed [7:0]       y
);
    localparam SUM_W  = (ACC_W > 32 ? ACC_W : 32) + 1;
    localparam PROD_W = SUM_W + 16;

    reg                     v1, v2;
    reg signed [SUM_W-1:0]  sum1;
    reg        [14:0]       m1;
    reg        [5:0]        s1, s2;
    reg signed [PROD_W-1:0] prod2;

    // round half up: add 2**(s-1) (0 when s = 0), then arithmetic shift right
    wire        [PROD_W:0]   one_sh = {{PROD_W{1'b0}}, 1'b1} << s2;
    wire signed [PROD_W:0]   half   = $signed({1'b0, one_sh[PROD_W:1]});
    wire signed [PROD_W:0]   rnd    = $signed({prod2[PROD_W-1], prod2}) + half;
    wire signed [PROD_W:0]   shr    = rnd >>> s2;

    always @(posedge clk) begin
        v1    <= in_valid;
        sum1  <= $signed(acc) + $signed(bias);
        m1    <= mult;
        s1    <= shift;
        v2    <= v1;
        prod2 <= sum1 * $signed({1'b0, m1});
        s2    <= s1;
        out_valid <= v2;
        if (shr > 127)       y <= 8'sd127;
        else if (shr < -128) y <= -8'sd128;
        else                 y <= shr[7:0];
    end
endmodule
