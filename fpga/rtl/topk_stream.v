// Top-K over a streamed vector, one value per beat, largest first, lower index first on ties. Mirrors
// topk_lowest(x, K) (K = 1: argmax_lowest), for the token tree's children. A vector is any number of beats
// (in_valid may gap); in_last marks its last beat; the index of beat b is b. The K best so far sit in a
// register array sorted by rank (rank 0 = largest). Each beat is an insertion: the new value displaces every
// rank it is STRICTLY greater than (or that is still empty); those ranks shift down by one and the last
// falls off. Strictly greater is the tie rule: an equal value comes later (higher index), so it ranks after
// the earlier one. Ranks are monotone (empty ranks last), so the displaced ranks are a suffix and one
// compare per rank is the whole sort. Pipeline: in regs -> insert + out regs (latency 2); II = 1 beat.
// Output at a vector's end, for one cycle: K indices and values, rank r in bits [r*IDX_W +: IDX_W] and
// [r*VAL_W +: VAL_W]. A vector needs at least K beats; with fewer, ranks >= its length are stale.
module topk_stream #(
    parameter K     = 4,
    parameter VAL_W = 32,
    parameter IDX_W = 16
) (
    input  wire               clk,
    input  wire               rst,
    input  wire               in_valid,
    input  wire               in_last,
    input  wire [VAL_W-1:0]   val,
    output reg                out_valid,
    output reg  [IDX_W*K-1:0] out_index,
    output reg  [VAL_W*K-1:0] out_value
);
    reg               v1, last1, first;
    reg [VAL_W-1:0]   val1;
    reg [IDX_W-1:0]   idx1, count;
    reg [VAL_W*K-1:0] tv;     // the sorted ranks
    reg [IDX_W*K-1:0] ti;
    reg [K-1:0]       full;   // rank holds an entry of this vector (a suffix of ranks is empty)

    // one insertion: win[r] = the new entry displaces rank r; the first such rank takes it, the rest shift
    reg [K-1:0]       ef, win, nf;
    reg [VAL_W*K-1:0] nv;
    reg [IDX_W*K-1:0] ni;
    integer r;
    always @(*) begin
        ef = first ? {K{1'b0}} : full;  // the first beat of a vector starts from an empty array
        for (r = 0; r < K; r = r + 1)
            win[r] = !ef[r] || ($signed(val1) > $signed(tv[VAL_W*r +: VAL_W]));
        nv = tv; ni = ti; nf = ef;
        if (win[0]) begin
            nv[0 +: VAL_W] = val1; ni[0 +: IDX_W] = idx1; nf[0] = 1'b1;
        end
        for (r = 1; r < K; r = r + 1)
            if (win[r]) begin
                if (win[r-1]) begin  // displaced from above: shift down one rank
                    nv[VAL_W*r +: VAL_W] = tv[VAL_W*(r-1) +: VAL_W];
                    ni[IDX_W*r +: IDX_W] = ti[IDX_W*(r-1) +: IDX_W];
                    nf[r] = ef[r-1];
                end else begin       // the insertion point
                    nv[VAL_W*r +: VAL_W] = val1;
                    ni[IDX_W*r +: IDX_W] = idx1;
                    nf[r] = 1'b1;
                end
            end
    end

    always @(posedge clk) begin
        v1 <= in_valid; last1 <= in_last; val1 <= val; idx1 <= count;
        if (in_valid) count <= in_last ? {IDX_W{1'b0}} : count + 1'b1;
        out_valid <= v1 && last1;
        if (v1) begin
            tv <= nv; ti <= ni; full <= nf;
            first <= last1;
            if (last1) begin
                out_value <= nv;
                out_index <= ni;
            end
        end
        if (rst) begin
            v1 <= 1'b0; out_valid <= 1'b0; first <= 1'b1; full <= {K{1'b0}}; count <= {IDX_W{1'b0}};
        end
    end
endmodule
