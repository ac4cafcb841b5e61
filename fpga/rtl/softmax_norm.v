// Softmax normalisation over vectors of L exp values (Q1.15, from softmax_exp) streamed W per beat.
// Mirrors fixed_point.softmax_normalize:
//   s = max(sum e, 2**15); (r, k) = reciprocal_q15(s); p = round(e * r / 2**(15 + k)) (0 if sum e = 0)
// reciprocal (7 stages): bit length -> m = s >> k in [2**15, 2**16) -> seed LUT (recip_seed.hex) at
// m[14:9] -> 2 Newton steps of 2 stages (t = round(m r / 2**15); r = round(r (2**16 - t) / 2**15)).
// The e beats wait in a fixed delay of L/W + 7 beats, so a vector is exactly L/W contiguous beats;
// vectors may follow back to back (II = L/W cycles). The max-subtract before softmax_exp is
// argmax_stream's out_value.
module softmax_norm #(
    parameter L         = 32,
    parameter W         = 8,
    parameter SEED_FILE = "recip_seed.hex"
) (
    input  wire            clk,
    input  wire            rst,
    input  wire            in_valid,
    input  wire            in_last,
    input  wire [16*W-1:0] e,
    output reg             out_valid,
    output reg             out_last,
    output reg  [16*W-1:0] p
);
    localparam B       = L / W;
    localparam REC_LAT = 7;
    localparam DL      = B + REC_LAT;
    localparam S_W     = 16 + $clog2(L) + 1;
    localparam K_W     = 6;

    // ---------------------------------------------------------------- input stage: beat sum
    reg              v1, last1, first1;
    reg [16*W-1:0]   e1;
    reg [S_W-1:0]    bs1, acc, s0;
    reg [S_W-1:0]    beat_sum;
    integer i;
    always @(*) begin
        beat_sum = 0;
        for (i = 0; i < W; i = i + 1)
            beat_sum = beat_sum + e[16*i +: 16];
    end
    always @(posedge clk) begin
        v1 <= in_valid; last1 <= in_last; e1 <= e; bs1 <= beat_sum;
        if (v1) begin
            acc <= last1 ? {S_W{1'b0}} : (first1 ? bs1 : acc + bs1);
            first1 <= last1;
            s0 <= (first1 ? {S_W{1'b0}} : acc) + bs1;
        end
        if (rst) begin
            v1 <= 1'b0; first1 <= 1'b1;
        end
    end

    // ---------------------------------------------------------------- reciprocal pipeline
    reg [15:0] seed_rom [0:63];
    initial $readmemh(SEED_FILE, seed_rom);

    reg [S_W-1:0] sc;        // max(s, 2**15)
    reg [6:0]     bl;
    always @(*) begin
        sc = (s0 < 32768) ? 32768 : s0;
        bl = 0;
        for (i = 0; i < S_W; i = i + 1)
            if (sc[i]) bl = i + 1;
    end
    reg [S_W-1:0] sc1;
    reg [K_W-1:0] k1, k2, k3, k4, k5, k6, k7;
    reg           z1, z2, z3, z4, z5, z6, z7;   // sum was zero
    reg [15:0]    m2, m3, m4, m5;
    reg [16:0]    t4, t6;
    reg [16:0]    r3, r4, r5, r6, r7;
    wire [32:0]   mr_a = m3 * r3;
    wire [32:0]   mr_b = m5 * r5;
    wire [33:0]   rh_a = r4 * (17'd65536 - t4);
    wire [33:0]   rh_b = r6 * (17'd65536 - t6);
    always @(posedge clk) begin
        sc1 <= sc; k1 <= bl - 16; z1 <= (s0 == 0);
        m2 <= sc1 >> k1; k2 <= k1; z2 <= z1;
        r3 <= {1'b0, seed_rom[m2[14:9]]}; m3 <= m2; k3 <= k2; z3 <= z2;
        t4 <= (mr_a + 33'h4000) >> 15; r4 <= r3; m4 <= m3; k4 <= k3; z4 <= z3;
        r5 <= (rh_a + 34'h4000) >> 15; m5 <= m4; k5 <= k4; z5 <= z4;
        t6 <= (mr_b + 33'h4000) >> 15; r6 <= r5; k6 <= k5; z6 <= z5;
        r7 <= (rh_b + 34'h4000) >> 15; k7 <= k6; z7 <= z6;
    end

    // ---------------------------------------------------------------- delay line for e
    reg  [DL-1:0]    dl_v;
    wire [16*W+1:0] dl_out;
    delay_ram #(.WIDTH(16*W+2), .DELAY(DL)) delay (.clk(clk), .din({last1, first1, e1}), .dout(dl_out));
    always @(posedge clk) dl_v <= rst ? {DL{1'b0}} : {dl_v[DL-2:0], v1};
    wire            d_valid = dl_v[DL-1];
    wire            d_last  = dl_out[16*W+1];
    wire            d_first = dl_out[16*W];
    wire [16*W-1:0] d_e     = dl_out[16*W-1:0];

    // ---------------------------------------------------------------- output: e * r, round, shift
    reg  [16:0]    r_hold;
    reg  [K_W-1:0] k_hold;
    reg            z_hold;
    wire           take  = d_valid && d_first;
    wire [16:0]    r_cur = take ? r7 : r_hold;
    wire [K_W-1:0] k_cur = take ? k7 : k_hold;
    wire           z_cur = take ? z7 : z_hold;
    reg            ov1, ol1, zs1;
    reg [K_W:0]    ts1;
    reg [33*W-1:0] q1;
    wire [47:0]    half = ({47'd0, 1'b1} << ts1) >> 1;
    reg  [47:0]    sh;
    always @(posedge clk) begin
        if (take) begin
            r_hold <= r7; k_hold <= k7; z_hold <= z7;
        end
        ov1 <= d_valid; ol1 <= d_last; ts1 <= 15 + k_cur; zs1 <= z_cur;
        for (i = 0; i < W; i = i + 1)
            q1[33*i +: 33] <= d_e[16*i +: 16] * r_cur;
        out_valid <= ov1; out_last <= ol1;
        for (i = 0; i < W; i = i + 1) begin
            sh = (q1[33*i +: 33] + half) >> ts1;
            p[16*i +: 16] <= zs1 ? 16'd0 : sh[15:0];
        end
        if (rst) begin
            ov1 <= 1'b0; out_valid <= 1'b0;
        end
    end
endmodule
